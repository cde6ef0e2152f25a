"""Recipes for the accumulation tests: clean controls and one deliberate fault per diagnosis code.

Module-level classes, so that isolation="process" can rebuild them in a fresh process. Models
are float64 and the tests declare a tight tolerance, so float rounding never hides or fakes a
fault; `ExactLinear` is exact in binary arithmetic and passes the default exact comparison.
"""

from __future__ import annotations

import dataclasses
import gc
import time
import weakref
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import clip_grad_norm_
from torch.utils.data import DataLoader, TensorDataset

import trainparity as tp

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]

TOLERANCE = tp.ToleranceComparison(rtol=1e-9, atol=1e-12)
#: States built by recipes that record them (hook-removal tests inspect them after the check)
BUILT: list[tp.State] = []


class MLP(tp.Recipe):
    """Momentum SGD on a small float64 MLP; returns the scaled micro-batch loss (the one back-propagated)."""

    def __init__(self, accumulation_steps: int = 1, batch_size: int = 8, record: bool = False) -> None:
        self.accumulation_steps = accumulation_steps
        self.batch_size = batch_size
        self.record = record

    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def setup(self) -> tp.State:
        model = self.model()
        x = torch.randn(64, 4, dtype=torch.float64)
        y = torch.randn(64, 1, dtype=torch.float64)
        loader = DataLoader(TensorDataset(x, y), batch_size=self.batch_size, shuffle=True)
        state = tp.State(model=model, optimizer=self.optimizer(model), loader=loader, micro=0)
        if self.record:
            BUILT.append(state)
        return state

    def loss(self, state: tp.State, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(state.model(x), y)

    def boundary(self, state: tp.State) -> bool:
        state.micro += 1
        return bool(state.micro % self.accumulation_steps == 0)

    def update(self, state: tp.State) -> None:
        state.optimizer.step()
        state.optimizer.zero_grad()

    def step(self, state: tp.State, batch: Any) -> Any:
        loss = self.loss(state, batch) / self.accumulation_steps
        loss.backward()
        if self.boundary(state):
            self.update(state)
        return loss


# -- clean controls --------------------------------------------------------------------------------


class AdamWUnscaledReturn(MLP):
    """AdamW; returns the unscaled micro-batch loss (the other common convention)."""

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)

    def step(self, state: tp.State, batch: Any) -> Any:
        loss = self.loss(state, batch)
        (loss / self.accumulation_steps).backward()
        if self.boundary(state):
            self.update(state)
        return loss.detach()


class CheckpointsInStep(AdamWUnscaledReturn):
    """Takes torch.distributed.checkpoint's state dicts inside step(), as a periodic checkpoint would: on
    the first call the optimizer has no state yet, and get_state_dict creates it by a zero-gradient,
    learning-rate-0 step that is not training."""

    def step(self, state: tp.State, batch: Any) -> Any:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        get_state_dict(state.model, state.optimizer)
        return super().step(state, batch)


class ClipAtBoundary(MLP):
    """Clips (a threshold that bites) once per optimizer step, after the last backward; steps a scheduler."""

    def setup(self) -> tp.State:
        state = super().setup()
        state.scheduler = torch.optim.lr_scheduler.StepLR(state.optimizer, step_size=1, gamma=0.5)
        return state

    def update(self, state: tp.State) -> None:
        torch.nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=0.05)
        state.optimizer.step()
        state.optimizer.zero_grad()
        state.scheduler.step()


class Scaled(MLP):
    """A CPU GradScaler used by the book: scale, unscale_ before clipping, scaler.step, update."""

    def setup(self) -> tp.State:
        state = super().setup()
        state.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        return state

    def step(self, state: tp.State, batch: Any) -> Any:
        loss = self.loss(state, batch) / self.accumulation_steps
        state.scaler.scale(loss).backward()
        if self.boundary(state):
            state.scaler.unscale_(state.optimizer)
            torch.nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=0.05)
            state.scaler.step(state.optimizer)
            state.scaler.update()
            state.optimizer.zero_grad()
        return loss


class SumOverWindow(MLP):
    """Per-sample losses summed and divided by the full batch size: right for any micro-batch sizes."""

    def step(self, state: tp.State, batch: Any) -> Any:
        x, y = batch
        loss = F.mse_loss(state.model(x), y, reduction="sum") / self.batch_size
        loss.backward()
        if self.boundary(state):
            self.update(state)
        return loss


@dataclasses.dataclass
class Tokens:
    """A batch of variable-length sequences; `window_tokens` is batch-level (0-dim), shared by micro-batches."""

    x: torch.Tensor
    mask: torch.Tensor
    y: torch.Tensor
    window_tokens: torch.Tensor


class TokenWeighted(MLP):
    """Masked per-token loss normalized by the window's token count; declares it with tp.LossAccounting."""

    def setup(self) -> tp.State:
        model = nn.Linear(3, 1).double()
        lengths = torch.randint(1, 6, (64,))
        mask = torch.arange(5).expand(64, 5) < lengths[:, None]
        x = torch.randn(64, 5, 3, dtype=torch.float64)
        y = torch.randn(64, 5, dtype=torch.float64)
        batches = [Tokens(x[i:i + 8], mask[i:i + 8], y[i:i + 8], mask[i:i + 8].sum()) for i in range(0, 64, 8)]
        state = tp.State(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), micro=0)
        state.data = batches
        return state

    def batches(self, state: tp.State) -> Any:
        return iter(state.data)

    def token_losses(self, state: tp.State, batch: Tokens) -> tuple[torch.Tensor, torch.Tensor]:
        per_token = (state.model(batch.x).squeeze(-1) - batch.y) ** 2
        return (per_token * batch.mask).sum(), batch.mask.sum()

    def step(self, state: tp.State, batch: Any) -> Any:
        total, tokens = self.token_losses(state, batch)
        loss = total / batch.window_tokens
        loss.backward()
        if self.boundary(state):
            self.update(state)
        return tp.LossAccounting(loss.detach(), total.detach(), tokens)


class ExactLinear(MLP):
    """A linear model on small dyadic numbers: every sum is exact, so the default exact comparison holds."""

    def model(self) -> nn.Module:
        model = nn.Linear(2, 1, bias=False).double()
        with torch.no_grad():
            model.weight.copy_(torch.tensor([[0.5, -0.25]], dtype=torch.float64))
        return model

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.125)

    def setup(self) -> tp.State:
        model = self.model()
        x = torch.randint(-2, 3, (64, 2)).double()
        y = torch.randint(-2, 3, (64, 1)).double()
        loader = DataLoader(TensorDataset(x, y), batch_size=self.batch_size)
        return tp.State(model=model, optimizer=self.optimizer(model), loader=loader, micro=0)


# -- one fault per diagnosis code ------------------------------------------------------------------


class NotScaled(MLP):
    def step(self, state: tp.State, batch: Any) -> Any:
        loss = self.loss(state, batch)
        loss.backward()  # fault: not divided by accumulation_steps
        if self.boundary(state):
            self.update(state)
        return loss


class ScaledTwice(MLP):
    def step(self, state: tp.State, batch: Any) -> Any:
        loss = self.loss(state, batch) / self.accumulation_steps
        (loss / self.accumulation_steps).backward()  # fault: divided again
        if self.boundary(state):
            self.update(state)
        return loss


class NoZeroGrad(MLP):
    def update(self, state: tp.State) -> None:
        state.optimizer.step()  # fault: gradients never reset


class Premature(MLP):
    def boundary(self, state: tp.State) -> bool:
        state.micro += 1
        return bool(state.micro % self.accumulation_steps == 1 % self.accumulation_steps)  # fault: first, not last


class StepsEveryMicrobatch(MLP):
    def boundary(self, state: tp.State) -> bool:
        return True  # fault: no accumulation at all


class SamplesPerStep(MLP):
    """Steps every `batch_size * accumulation_steps` samples, as if each call got a full batch."""

    def step(self, state: tp.State, batch: Any) -> Any:
        loss = self.loss(state, batch) / self.accumulation_steps
        loss.backward()
        state.micro += len(batch[0])
        if state.micro % (self.batch_size * self.accumulation_steps) == 0:  # fault: never, for micro-batches
            self.update(state)
        return loss


class SchedulerPerMicrobatch(ClipAtBoundary):
    def update(self, state: tp.State) -> None:
        state.optimizer.step()
        state.optimizer.zero_grad()

    def step(self, state: tp.State, batch: Any) -> Any:
        loss = super().step(state, batch)
        state.scheduler.step()  # fault: once per micro-batch
        return loss


class ClipPerMicrobatch(MLP):
    """Clips after every backward; calls the name imported from torch.nn.utils, as many scripts do."""

    def __init__(self, accumulation_steps: int = 1, max_norm: float = 0.05, record: bool = False) -> None:
        super().__init__(accumulation_steps, record=record)
        self.max_norm = max_norm

    def step(self, state: tp.State, batch: Any) -> Any:
        loss = self.loss(state, batch) / self.accumulation_steps
        loss.backward()
        clip_grad_norm_(state.model.parameters(), max_norm=self.max_norm)  # fault: every micro-batch
        if self.boundary(state):
            self.update(state)
        return loss


class MeanOfMeans(TokenWeighted):
    def step(self, state: tp.State, batch: Any) -> Any:
        total, tokens = self.token_losses(state, batch)
        loss = total / tokens / self.accumulation_steps  # fault: each micro-batch's own token mean
        loss.backward()
        if self.boundary(state):
            self.update(state)
        return tp.LossAccounting(loss.detach(), total.detach(), tokens)


class MeanOfMeansBareLoss(MeanOfMeans):
    """The same fault, returning a bare loss: the gradients phase has to find it."""

    def step(self, state: tp.State, batch: Any) -> Any:
        result = super().step(state, batch)
        return result.value


class TokensOwnMean(TokenWeighted):
    def step(self, state: tp.State, batch: Any) -> Any:
        total, tokens = self.token_losses(state, batch)
        loss = total / tokens  # fault: its own token mean, never divided by the number of micro-batches
        loss.backward()
        if self.boundary(state):
            self.update(state)
        return tp.LossAccounting(loss.detach(), total.detach(), tokens)


class TokenWeightedUnscaledValue(TokenWeighted):
    """Trains correctly but declares each micro-batch's own token mean as LossAccounting.value."""

    def step(self, state: tp.State, batch: Any) -> Any:
        total, tokens = self.token_losses(state, batch)
        (total / batch.window_tokens).backward()
        if self.boundary(state):
            self.update(state)
        return tp.LossAccounting((total / tokens).detach(), total.detach(), tokens)


class ZeroGradEveryCall(MLP):
    def step(self, state: tp.State, batch: Any) -> Any:
        state.optimizer.zero_grad()  # fault: drops the micro-batches accumulated so far
        return super().step(state, batch)


class ClipBeforeUnscale(Scaled):
    def step(self, state: tp.State, batch: Any) -> Any:
        loss = self.loss(state, batch) / self.accumulation_steps
        state.scaler.scale(loss).backward()
        if self.boundary(state):
            torch.nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=0.05)  # fault: still scaled
            state.scaler.step(state.optimizer)
            state.scaler.update()
            state.optimizer.zero_grad()
        return loss


class MeanOfMeansDeclared(TokenWeighted):
    """Each micro-batch normalized by its own token count times k, and declared so: the denominators add up
    to k times the window's."""

    def step(self, state: tp.State, batch: Any) -> Any:
        total, tokens = self.token_losses(state, batch)
        loss = total / (tokens * self.accumulation_steps)  # fault: a mean of means
        loss.backward()
        if self.boundary(state):
            self.update(state)
        return tp.LossAccounting(loss.detach(), total.detach(), tokens * self.accumulation_steps)


class ScalerStepBypassed(Scaled):
    def step(self, state: tp.State, batch: Any) -> Any:
        loss = self.loss(state, batch) / self.accumulation_steps
        state.scaler.scale(loss).backward()
        if self.boundary(state):
            state.optimizer.step()  # fault: steps on the scaled gradients, bypassing scaler.step
            state.optimizer.zero_grad()
        return loss


class LrFromCounter(MLP):
    """nanoGPT's schedule: the learning rate set from get_lr(iter_num) at the first micro-batch of each step."""

    def __init__(self, accumulation_steps: int = 1, per_microbatch: bool = False) -> None:
        super().__init__(accumulation_steps)
        self.per_microbatch = per_microbatch

    def setup(self) -> tp.State:
        state = super().setup()
        state.iter_num = 0
        return state

    def get_lr(self, iteration: int) -> float:
        return 0.1 * min(1.0, (iteration + 1) / 10)  # linear warmup

    def step(self, state: tp.State, batch: Any) -> Any:
        if state.micro % self.accumulation_steps == 0:
            for group in state.optimizer.param_groups:
                group["lr"] = self.get_lr(state.iter_num)
        loss = self.loss(state, batch) / self.accumulation_steps
        loss.backward()
        if self.per_microbatch:
            state.iter_num += 1  # fault: nanoGPT's iter_num += 1 moved into the micro-batch loop
        if self.boundary(state):
            self.update(state)
            if not self.per_microbatch:
                state.iter_num += 1
        return loss


class EvaluatesEachStep(MLP):
    """Like nanoGPT's loop: an evaluation on randomly drawn batches at the start of every optimizer step."""

    def __init__(self, accumulation_steps: int = 1, scaled: bool = True) -> None:
        super().__init__(accumulation_steps)
        self.scaled = scaled

    def step(self, state: tp.State, batch: Any) -> Any:
        if state.micro % self.accumulation_steps == 0:
            with torch.no_grad():
                rows = torch.randint(0, 64, (8,))
                x, y = state.loader.dataset.tensors
                state.eval_loss = float(F.mse_loss(state.model(x[rows]), y[rows]))
        loss = self.loss(state, batch) / (self.accumulation_steps if self.scaled else 1)
        loss.backward()
        if self.boundary(state):
            self.update(state)
        return loss


class FunctionalDropout(MLP):
    """Dropout through torch.nn.functional, not a module."""

    def loss(self, state: tp.State, batch: Any) -> torch.Tensor:
        x, y = batch
        hidden = F.dropout(torch.tanh(state.model[0](x)), p=0.5, training=True)
        return F.mse_loss(state.model[2](hidden), y)


class AttentionDropout(MLP):
    """scaled_dot_product_attention with dropout_p, and nn.MultiheadAttention's dropout."""

    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(4, 8), nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True),
                             nn.Linear(8, 1)).double()

    def loss(self, state: tp.State, batch: Any) -> torch.Tensor:
        x, y = batch
        h = state.model[0](x).unsqueeze(1).expand(-1, 3, -1)
        attended, _ = state.model[1](h, h, h)
        mixed = F.scaled_dot_product_attention(attended, attended, attended, dropout_p=0.5)
        return F.mse_loss(state.model[2](mixed.mean(1)), y)


class ForcesFloat32(MLP):
    """Casts its inputs and model to float32 in step(): it cannot run in float64."""

    def step(self, state: tp.State, batch: Any) -> Any:
        state.model.float()
        x, y = batch
        loss = F.mse_loss(state.model(x.float()), y.float()) / self.accumulation_steps
        loss.backward()
        if self.boundary(state):
            self.update(state)
        return loss


class AutocastScaled(Scaled):
    """autocast(bfloat16) around the forward, with a GradScaler: the mixed-precision loop."""

    def loss(self, state: tp.State, batch: Any) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return super().loss(state, batch)


class AdamWWide(tp.Recipe):
    """Four Linear(width, width) layers with AdamW: float32 rounding in near-zero gradients becomes whole steps."""

    def __init__(self, accumulation_steps: int = 1, width: int = 1024, batch_size: int = 16,
                 scaled: bool = True) -> None:
        self.accumulation_steps, self.width = accumulation_steps, width
        self.batch_size, self.scaled = batch_size, scaled

    def setup(self) -> tp.State:
        model = nn.Sequential(*(layer for _ in range(4) for layer in (nn.Linear(self.width, self.width), nn.ReLU())))
        x, y = torch.randn(64, self.width), torch.randn(64, self.width)
        loader = DataLoader(TensorDataset(x, y), batch_size=self.batch_size)
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), loader=loader, micro=0)

    def step(self, state: tp.State, batch: Any) -> Any:
        x, y = batch
        loss = F.mse_loss(state.model(x), y) / (self.accumulation_steps if self.scaled else 1)
        loss.backward()
        state.micro += 1
        if state.micro % self.accumulation_steps == 0:
            state.optimizer.step()
            state.optimizer.zero_grad()
        return loss.detach()


# -- modules and code that make the equivalence unverifiable, and broken recipes -------------------


class WithDropout(MLP):
    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.5), nn.Linear(8, 1)).double()


class WithBatchNorm(MLP):
    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1)).double()


class FrozenBatchNorm(WithBatchNorm):
    """BatchNorm in eval mode normalizes with its running statistics: nothing depends on the batch."""

    def step(self, state: tp.State, batch: Any) -> Any:
        state.model.eval()
        return super().step(state, batch)


class NoisyStep(MLP):
    """Adds noise drawn from the global RNG inside step(): micro-batches draw other numbers."""

    def loss(self, state: tp.State, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(state.model(x + 0.1 * torch.randn_like(x)), y)


class RaisesInStep(MLP):
    def step(self, state: tp.State, batch: Any) -> Any:
        raise ValueError("boom in step")


class RaisesInCandidate(MLP):
    """Raises at the first micro-batch of the second window, in the candidate only."""

    def step(self, state: tp.State, batch: Any) -> Any:
        if self.accumulation_steps > 1 and state.micro == self.accumulation_steps:
            raise ValueError("boom in the candidate's second window")
        return super().step(state, batch)


class HangsInCandidate(MLP):
    """Hangs at its first micro-batch, in the candidate only."""

    def step(self, state: tp.State, batch: Any) -> Any:
        if self.accumulation_steps > 1:
            time.sleep(3600)
        return super().step(state, batch)


class CandidateFailsFirst(MLP):
    """One batch in all (the reference runs out at window 2); the candidate raises in window 1."""

    def batches(self, state: tp.State) -> Any:
        return iter([next(iter(state.loader))])

    def step(self, state: tp.State, batch: Any) -> Any:
        if self.accumulation_steps > 1:
            raise ValueError("boom in the candidate's first window")
        return super().step(state, batch)


#: the optimizer steps taken so far, nanoGPT's `iter_num` as a module global
ITERATIONS = 0


class ModuleLevelCounter(MLP):
    """A learning-rate warm-up read from a module-level step counter that setup() resets."""

    def setup(self) -> tp.State:
        global ITERATIONS
        ITERATIONS = 0
        return super().setup()

    def update(self, state: tp.State) -> None:
        global ITERATIONS
        for group in state.optimizer.param_groups:
            group["lr"] = 0.1 * min(1.0, (ITERATIONS + 1) / 10)
        ITERATIONS += 1
        super().update(state)


#: the one model of SharedModel and ModuleLevelModelReset, whichever run builds it, and its first weights
SHARED_MODEL = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
SHARED_INITIAL = {name: tensor.clone() for name, tensor in SHARED_MODEL.state_dict().items()}


class SharedModel(MLP):
    """setup() returns the same module-level model every call: the run set up second starts from what the first
    one trained."""

    def model(self) -> nn.Module:
        return SHARED_MODEL


class ModuleLevelModelReset(MLP):
    """A module-level model (built once) that setup() loads its first weights into."""

    def model(self) -> nn.Module:
        SHARED_MODEL.load_state_dict(SHARED_INITIAL)
        return SHARED_MODEL


#: the models alive when each setup() of CountsLiveModels began
ALIVE_AT_SETUP: list[int] = []
_LIVE_MODELS: weakref.WeakSet[nn.Module] = weakref.WeakSet()


class CountsLiveModels(MLP):
    def setup(self) -> tp.State:
        gc.collect()
        ALIVE_AT_SETUP.append(len(_LIVE_MODELS))
        state = super().setup()
        _LIVE_MODELS.add(state.model)
        return state


class NoAccumulationParameter(tp.Recipe):
    def __init__(self, lr: float = 0.1) -> None:
        self.lr = lr


class SetupDependsOnK(MLP):
    """Builds its loader from the micro-batch size: the two runs do not start from the same State."""

    def setup(self) -> tp.State:
        state = super().setup()
        state.loader = DataLoader(state.loader.dataset, batch_size=self.batch_size // self.accumulation_steps)
        return state


class ListBatch(MLP):
    """Batches holding per-sample values in plain lists, which tp.split_batch refuses to guess about."""

    def batches(self, state: tp.State) -> Any:
        for x, y in state.loader:
            yield {"x": x, "y": y, "weights": [1.0] * len(x)}

    def loss(self, state: tp.State, batch: Any) -> torch.Tensor:
        return super().loss(state, (batch["x"], batch["y"]))


class MLP32(MLP):
    """float32, where accumulating micro-batch gradients differs from the full batch in the last bits."""

    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def setup(self) -> tp.State:
        state = super().setup()
        dataset = state.loader.dataset
        state.loader = DataLoader(TensorDataset(*(t.float() for t in dataset.tensors)), batch_size=self.batch_size)
        return state


class Float32Rounding(MLP):
    """float32 accumulation that rounds the same way on every CPU, by construction: integer data (whose sums
    are exact in any order), the batch reduced before anything inexact, one division per call, elementwise
    accumulation, and an SGD step by a power of two. The micro-batches' 1/n/k still round differently from
    the full batch's 1/n."""

    def model(self) -> nn.Module:
        model = nn.Linear(4, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(1.0)
        return model

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.125)

    def setup(self) -> tp.State:
        generator = torch.Generator().manual_seed(0)
        x = torch.randint(-3, 4, (72, 4), generator=generator, dtype=torch.float32)
        model = self.model()
        loader = DataLoader(TensorDataset(x, torch.zeros(72, 1)), batch_size=12)
        return tp.State(model=model, optimizer=self.optimizer(model), loader=loader, micro=0)

    def loss(self, state: tp.State, batch: Any) -> torch.Tensor:
        x, _ = batch
        return (state.model.weight.squeeze(0) * x.sum(0)).sum() / len(x)


class DataDependsOnK(MLP):
    """Draws other batches when accumulating: the runs do not train on the same data."""

    def batches(self, state: tp.State) -> Any:
        for x, y in state.loader:
            yield x * self.accumulation_steps, y


def chunk_split(batch: Any, microbatches: Any) -> list[Any]:
    """A user-supplied split: torch.chunk on (x, y) tuples."""
    x, y = batch
    return list(zip(x.chunk(microbatches), y.chunk(microbatches), strict=True))


class TwoOptimizers(MLP):
    """Each layer has its own optimizer and scheduler, as in GAN-style code."""

    def __init__(self, accumulation_steps: int = 1, head_every_call: bool = False) -> None:
        super().__init__(accumulation_steps)
        self.head_every_call = head_every_call

    def setup(self) -> tp.State:
        body, head = nn.Linear(4, 8).double(), nn.Linear(8, 1).double()
        opt_body = torch.optim.SGD(body.parameters(), lr=0.1)
        opt_head = torch.optim.Adam(head.parameters(), lr=0.01)
        x, y = torch.randn(64, 4, dtype=torch.float64), torch.randn(64, 1, dtype=torch.float64)
        return tp.State(body=body, head=head, opt_body=opt_body, opt_head=opt_head,
                        sched_body=torch.optim.lr_scheduler.StepLR(opt_body, 1, gamma=0.5),
                        sched_head=torch.optim.lr_scheduler.StepLR(opt_head, 1, gamma=0.5),
                        loader=DataLoader(TensorDataset(x, y), batch_size=self.batch_size), micro=0)

    def parts(self, state: tp.State) -> tuple[Any, ...]:
        return state.body, state.head, state.opt_body, state.opt_head, state.sched_body, state.sched_head

    def step(self, state: tp.State, batch: Any) -> Any:
        body, head, opt_body, opt_head, sched_body, sched_head = self.parts(state)
        x, y = batch
        loss = F.mse_loss(head(torch.tanh(body(x))), y) / self.accumulation_steps
        loss.backward()
        boundary = self.boundary(state)
        if boundary or self.head_every_call:  # the fault, when asked: the head steps every micro-batch
            opt_head.step()
            opt_head.zero_grad()
        if boundary:
            opt_body.step()
            opt_body.zero_grad()
            sched_body.step()
            sched_head.step()
        return loss


class ContainedTwoOptimizers(TwoOptimizers):
    """The same, with the models in a list entry and the optimizers and schedulers in dict entries."""

    def setup(self) -> tp.State:
        flat = super().setup()
        return tp.State(models=[flat.body, flat.head], optimizers={"body": flat.opt_body, "head": flat.opt_head},
                        schedulers={"body": flat.sched_body, "head": flat.sched_head}, loader=flat.loader, micro=0)

    def parts(self, state: tp.State) -> tuple[Any, ...]:
        return (*state.models, state.optimizers["body"], state.optimizers["head"], state.schedulers["body"],
                state.schedulers["head"])


class Hangs(MLP):
    def step(self, state: tp.State, batch: Any) -> Any:
        import time

        time.sleep(600)
        return 0.0


class ModelOutsideState(MLP):
    """Keeps the model and optimizer on the recipe, not in the State: nothing for the check to see."""

    def setup(self) -> tp.State:
        state = super().setup()
        self.net, self.opt = state.model, state.optimizer
        return tp.State(loader=state.loader, micro=0)

    def step(self, state: tp.State, batch: Any) -> Any:
        x, y = batch
        loss = F.mse_loss(self.net(x), y) / self.accumulation_steps
        loss.backward()
        if self.boundary(state):
            self.opt.step()
            self.opt.zero_grad()
        return loss


class SparseEmbedding(MLP):
    """nn.Embedding(sparse=True): sparse gradients, observed as dense values."""

    def __init__(self, accumulation_steps: int = 1, scaled: bool = True) -> None:
        super().__init__(accumulation_steps)
        self.scaled = scaled

    def setup(self) -> tp.State:
        embedding = nn.Embedding(20, 4, sparse=True).double()
        ids, y = torch.randint(0, 20, (64,)), torch.randn(64, 4, dtype=torch.float64)
        loader = DataLoader(TensorDataset(ids, y), batch_size=self.batch_size)
        return tp.State(model=embedding, optimizer=torch.optim.SGD(embedding.parameters(), lr=0.1), loader=loader,
                        micro=0)

    def step(self, state: tp.State, batch: Any) -> Any:
        loss = self.loss(state, batch) / (self.accumulation_steps if self.scaled else 1)
        loss.backward()
        if self.boundary(state):
            self.update(state)
        return loss


class TokenWeightedPremature(TokenWeighted):
    """Declares LossAccounting and steps at the first micro-batch: later losses see stepped parameters."""

    boundary = Premature.boundary


class TokenWeightedEveryMicrobatch(TokenWeighted):
    def boundary(self, state: tp.State) -> bool:
        return True  # fault: no accumulation at all


class OneBatch(MLP):
    """batches() yields a single full batch: too few for two windows."""

    def batches(self, state: tp.State) -> Any:
        return iter([next(iter(state.loader))])
