"""Recipes for the frozen and train-mode checks, written the way training loops write them: a clean one, and one
per fault, each with its fixed twin where the fix is a line.

`Net` is a small MLP with a backbone (Linear, BatchNorm1d, ReLU) and a head (Dropout, Linear). The snapshots in
test_mode_reports.py quote line numbers of this file (where a mode switch happened): add new recipes at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm
from torch.utils.checkpoint import checkpoint

import trainparity as tp

Batch = tuple[torch.Tensor, torch.Tensor]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Sequential(nn.Dropout(0.5), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.backbone(x))
        return out


class Training(tp.Recipe):
    """Clean: the whole net trains with AdamW; evaluates every `eval_every` steps in eval mode under no_grad."""

    eval_every = 2

    def model(self) -> nn.Module:
        return self.network().double()  # float64: reports quote values the same on every CPU

    def network(self) -> nn.Module:
        return Net()

    def parameters(self, model: nn.Module) -> Any:
        return [p for p in model.parameters() if p.requires_grad]

    def setup(self) -> tp.State:
        model = self.model()
        return tp.State(model=model, optimizer=torch.optim.AdamW(self.parameters(model), lr=1e-2), calls=0)

    def batches(self, state: tp.State) -> Iterator[Batch]:
        generator = torch.Generator().manual_seed(0)
        while True:
            yield (torch.randn(8, 8, generator=generator, dtype=torch.float64),
                   torch.randn(8, 1, generator=generator, dtype=torch.float64))

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(state.model(x), y)

    def zero_grad(self, state: tp.State) -> None:
        state.optimizer.zero_grad()

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        loss = self.loss(state, batch)
        self.zero_grad(state)
        loss.backward()
        state.optimizer.step()
        state.calls += 1
        if state.calls % self.eval_every == 0:
            self.evaluate(state)
        return loss.detach()

    def evaluate(self, state: tp.State) -> float:
        state.model.eval()
        with torch.no_grad():
            error = float(state.model(torch.ones(4, 8, dtype=torch.float64)).abs().mean())
        state.model.train()
        return error


# -- freezing ------------------------------------------------------------------------------------------


class FrozenBackbone(Training):
    """Clean: the backbone frozen in setup() (requires_grad off, eval mode, kept in eval after model.train());
    the optimizer holds the trainable parameters."""

    def setup(self) -> tp.State:
        model = self.model()
        model.backbone.requires_grad_(False)
        model.backbone.eval()
        return tp.State(model=model, optimizer=torch.optim.AdamW(self.parameters(model), lr=1e-2), calls=0)

    def evaluate(self, state: tp.State) -> float:
        error = super().evaluate(state)
        state.model.backbone.eval()
        return error


class HoldsEveryParameter(FrozenBackbone):
    """Clean (mmcv's optimizer builder): the optimizer holds every parameter, the frozen ones' .grad stays None."""

    def parameters(self, model: nn.Module) -> Any:
        return model.parameters()


class StaleGradient(HoldsEveryParameter):
    """One step of the whole net in setup(), then the backbone frozen; zero_grad(set_to_none=False) keeps its
    gradients as zeros, and AdamW's moments and weight decay move it."""

    set_to_none = False

    def setup(self) -> tp.State:
        model = self.model()
        state = tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), calls=0)
        self.loss(state, next(iter(self.batches(state)))).backward()
        state.optimizer.step()
        model.backbone.requires_grad_(False)
        model.backbone.eval()
        return state

    def zero_grad(self, state: tp.State) -> None:
        state.optimizer.zero_grad(set_to_none=self.set_to_none)


class StaleGradientSetToNone(StaleGradient):
    """The fix: zero_grad() sets the gradients to None, and AdamW skips the frozen backbone."""

    set_to_none = True


class BackboneInTrainMode(FrozenBackbone):
    """The backbone frozen with requires_grad_(False) alone: model.train() puts its BatchNorm back in train mode."""

    def setup(self) -> tp.State:
        model = self.model()
        model.backbone.requires_grad_(False)
        return tp.State(model=model, optimizer=torch.optim.AdamW(self.parameters(model), lr=1e-2), calls=0)


class StagedBackbone(nn.Module):
    """mmpretrain's ResNet before issue 702 was fixed: `frozen_stages` applied only in train()."""

    def __init__(self, frozen_stages: int, freeze_in_init: bool) -> None:
        super().__init__()
        self.stages = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.ReLU()), nn.Sequential(nn.Linear(16, 16)))
        self.frozen_stages = frozen_stages
        if freeze_in_init:
            self._freeze_stages()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.stages(x)
        return out

    def _freeze_stages(self) -> None:
        for stage in self.stages[: self.frozen_stages]:
            stage.eval()
            stage.requires_grad_(False)

    def train(self, mode: bool = True) -> StagedBackbone:
        super().train(mode)
        self._freeze_stages()
        return self


class FrozenStagesNeverApplied(Training):
    """The first stage is meant to be frozen (frozen_stages=1), but nothing calls model.train() before training."""

    freeze_in_init = False
    eval_every = 1000

    def network(self) -> nn.Module:
        return nn.Sequential(StagedBackbone(1, self.freeze_in_init), nn.Linear(16, 1))


class FrozenStagesAppliedInInit(FrozenStagesNeverApplied):
    """The fix of issue 702: _freeze_stages() in __init__ too."""

    freeze_in_init = True


class WritesFrozenWeights(FrozenBackbone):
    """The loop's own code scales the frozen first layer (a max-norm constraint applied to every layer)."""

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        loss = super().step(state, batch)
        with torch.no_grad():
            for module in state.model.modules():
                if isinstance(module, nn.Linear):
                    module.weight.mul_(0.5)
        return loss


class ResetsFrozenStatistics(FrozenBackbone):
    """The loop resets every BatchNorm's running statistics, the frozen backbone's too (pretrained ones: setup()
    ran a forward in train mode before freezing)."""

    def model(self) -> nn.Module:
        model = super().model()
        model(torch.randn(8, 8, dtype=torch.float64))
        return model

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        state.model.backbone[1].reset_running_stats()
        return super().step(state, batch)


class NothingFrozen(Training):
    """Nothing is frozen: check_frozen has nothing to watch unless frozen= declares something."""


class NoModule(tp.Recipe):
    """The State holds a tensor and an optimizer, no module."""

    def setup(self) -> tp.State:
        weight = torch.zeros(3, requires_grad=True)
        return tp.State(weight=weight, optimizer=torch.optim.SGD([weight], lr=0.1))

    def batches(self, state: tp.State) -> Iterator[torch.Tensor]:
        while True:
            yield torch.ones(3)

    def step(self, state: tp.State, batch: torch.Tensor) -> torch.Tensor:
        loss = (state.weight * batch).sum()
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        return loss.detach()


class Raises(Training):
    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        raise ValueError("the data pipeline broke")


# -- train and eval mode -----------------------------------------------------------------------------------


class EvalWithoutTrain(Training):
    """The evaluation every 2 steps switches to eval() and never back: step 3 trains in eval mode."""

    def evaluate(self, state: tp.State) -> float:
        state.model.eval()
        with torch.no_grad():
            return float(state.model(torch.ones(4, 8, dtype=torch.float64)).abs().mean())


class NoGradEvaluation(Training):
    """The evaluation runs under no_grad() without model.eval(): BatchNorm statistics and dropout draws of training."""

    def evaluate(self, state: tp.State) -> float:
        with torch.no_grad():
            return float(state.model(torch.ones(4, 8, dtype=torch.float64)).abs().mean())


class EvalInSetup(Training):
    """setup() loads the model and calls model.eval(); nothing calls model.train()."""

    def network(self) -> nn.Module:
        return Net().eval()


class LoggedForward(Training):
    """A second forward for a logged metric, with gradients enabled, in train mode: its output is never
    back-propagated, but its dropout draws from the training's RNG stream and its BatchNorm updates statistics."""

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        loss = super().step(state, batch)
        state.metric = state.model(batch[0]).mean().item()
        return loss


class ExplicitDropout(nn.Module):
    """transformers before PR 33844: F.dropout without training=self.training drops in eval mode too."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.p)


class DropoutIgnoresMode(Training):
    """The evaluation is right (eval mode, no_grad), but a layer drops in eval mode: it draws from the RNG."""

    def network(self) -> nn.Module:
        return nn.Sequential(nn.Linear(8, 16), ExplicitDropout(0.5), nn.Linear(16, 1))


class NoisyLinear(nn.Linear):
    """Noise injection in training only: its forward reads self.training."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out + 0.1 * torch.randn_like(out) if self.training else out


class NoisyEvalWithoutTrain(EvalWithoutTrain):
    def network(self) -> nn.Module:
        return nn.Sequential(NoisyLinear(8, 16), nn.ReLU(), nn.Linear(16, 1))


class Attention(nn.Module):
    """Self-attention through F.scaled_dot_product_attention, its dropout only in training."""

    def __init__(self, width: int = 8, dropout: float = 0.1) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)


class AttentionEvalWithoutTrain(EvalWithoutTrain):
    def network(self) -> nn.Module:
        return nn.Sequential(nn.Unflatten(1, (2, 4)), nn.Linear(4, 8), Attention(), nn.Flatten(), nn.Linear(16, 1))


class SpectralNormNoGradEvaluation(NoGradEvaluation):
    """pytorch issue 51800: spectral_norm's power iteration runs in every train-mode forward, an evaluation's too."""

    def network(self) -> nn.Module:
        return nn.Sequential(spectral_norm(nn.Linear(8, 16)), nn.ReLU(), nn.Linear(16, 1))


class Distillation(Training):
    """A student learns from a frozen teacher; `teacher_in_train_mode` forgets teacher.eval()."""

    def __init__(self, teacher_in_train_mode: bool = False) -> None:
        self.teacher_in_train_mode = teacher_in_train_mode

    def setup(self) -> tp.State:
        student, teacher = Net().double(), Net().double().requires_grad_(False)
        if not self.teacher_in_train_mode:
            teacher.eval()
        return tp.State(student=student, teacher=teacher,
                        optimizer=torch.optim.AdamW(student.parameters(), lr=1e-2), calls=0)

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        with torch.no_grad():
            target = state.teacher(batch[0])
        return F.mse_loss(state.student(batch[0]), target)

    def evaluate(self, state: tp.State) -> float:
        return 0.0


class CheckpointedBlock(nn.Module):
    """Activation checkpointing: the block's forward runs again in the backward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.ReLU())
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = checkpoint(self.block, x, use_reentrant=False)
        out: torch.Tensor = self.out(hidden)
        return out


class Checkpointed(Training):
    def network(self) -> nn.Module:
        return CheckpointedBlock()


class NoForward(Training):
    """The State holds the model, but step() never calls it."""

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        weight: torch.Tensor = state.model.head[1].weight
        return weight.pow(2).sum()

    def evaluate(self, state: tp.State) -> float:
        return 0.0


class InferenceModeEvaluation(Training):
    """The evaluation runs under torch.inference_mode() without model.eval()."""

    def evaluate(self, state: tp.State) -> float:
        with torch.inference_mode():
            return float(state.model(torch.ones(4, 8, dtype=torch.float64)).abs().mean())
