"""Recipes for the preflight checks: a clean one, and one per diagnosis.

`MLP` trains a small MLP with AdamW; `GPT` is a GPT-shaped language model whose `lm_head`
shares its weight with the token embedding `wte` (nanoGPT's weight tying and its
decay/no-decay optimizer groups); `Amp` is the CPU mixed-precision loop (autocast in
bfloat16, a `torch.amp.GradScaler("cpu")`, unscale before clipping, `scaler.step`,
`scaler.update`). Each subclass carries one fault.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import trainparity as tp

Batch = tuple[torch.Tensor, torch.Tensor]


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


class MLP(tp.Recipe):
    """Clean: every parameter in one AdamW group, every parameter in the loss."""

    def model(self) -> nn.Module:
        return mlp()

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=1e-2)

    def setup(self) -> tp.State:
        model = self.model()
        return tp.State(model=model, optimizer=self.optimizer(model))

    def batches(self, state: tp.State) -> Iterator[Batch]:
        generator = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(8, 8, generator=generator), torch.randn(8, 1, generator=generator)

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(state.model(x), y)

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        loss = self.loss(state, batch)
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        return loss.detach()


class HeadNotOptimized(MLP):
    """The optimizer is built from the first layer only: the head trains with no optimizer."""

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model[0].parameters(), lr=1e-2)


class HeadInTwoOptimizers(MLP):
    """A second optimizer for the head, while the first was built from the whole model."""

    def setup(self) -> tp.State:
        state = super().setup()
        state.head_optimizer = torch.optim.SGD(state.model[2].parameters(), lr=1e-3)
        return state

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        loss = super().step(state, batch)
        state.head_optimizer.step()
        return loss


class DuplicateInGroup(MLP):
    """The head's weight listed twice in one group (torch only warns)."""

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD([*model.parameters(), model[2].weight], lr=1e-2)


class FrozenInOptimizer(MLP):
    """The first layer is frozen, but the optimizer is built from model.parameters()."""

    def model(self) -> nn.Module:
        model = mlp()
        model[0].requires_grad_(False)
        return model


class UnfreezesWithoutOptimizing(FrozenInOptimizer):
    """Progressive unfreezing gone wrong: the first layer is unfrozen in step 1, never added to the optimizer."""

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        state.model[0].requires_grad_(True)  # the bug: no state.optimizer.add_param_group(...)
        return super().step(state, batch)


class StaleGradAdamW(FrozenInOptimizer):
    """The first layer trained once in setup(), then frozen; zero_grad(set_to_none=False) keeps its gradient (zeros),
    so AdamW's moments and weight decay keep moving it."""

    def setup(self) -> tp.State:
        model = mlp()
        optimizer = self.optimizer(model)
        state = tp.State(model=model, optimizer=optimizer)
        super().step(state, next(iter(self.batches(state))))
        model[0].requires_grad_(False)
        return state

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        loss = self.loss(state, batch)
        state.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        state.optimizer.step()
        return loss.detach()


class StaleGradPlainSGD(StaleGradAdamW):
    """The same stale gradients under plain SGD: a zero gradient and no momentum or weight decay move nothing."""

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=1e-2)


class FreezesLaterWithStaleGrad(StaleGradAdamW):
    """The first layer trains in step 1 and is frozen from step 2 on, its gradients kept (as zeros)."""

    def setup(self) -> tp.State:
        model = mlp()
        return tp.State(model=model, optimizer=self.optimizer(model), calls=0)

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        state.calls += 1
        if state.calls == 2:
            state.model[0].requires_grad_(False)
        return super().step(state, batch)


class UnfreezesHeldParameters(FrozenInOptimizer):
    """Progressive unfreezing done right: the optimizer holds the frozen layer from the start, unfrozen in step 2."""

    def setup(self) -> tp.State:
        return tp.State(**vars(super().setup()), calls=0)

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        state.calls += 1
        if state.calls == 2:
            state.model[0].requires_grad_(True)
        return super().step(state, batch)


class OptimizerForCopy(MLP):
    """The optimizer is built, then the model is rebuilt: the optimizer holds the first copy's parameters."""

    def setup(self) -> tp.State:
        model = self.model()
        optimizer = self.optimizer(model)
        model = self.model()
        return tp.State(model=model, optimizer=optimizer)


class WithAuxiliaryHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()
        self.aux = nn.Linear(16, 3)  # meant for an auxiliary loss that the recipe forgot

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return out


class UnusedHead(MLP):
    """A trainable head that takes no part in the loss: the find_unused_parameters trap of DDP."""

    def model(self) -> nn.Module:
        return WithAuxiliaryHead()


class LearnedTemperature(MLP):
    """A learnable scalar kept as a State entry, optimized with the model: not foreign."""

    def setup(self) -> tp.State:
        model = self.model()
        temperature = nn.Parameter(torch.ones(()))
        optimizer = torch.optim.AdamW([*model.parameters(), temperature], lr=1e-2)
        return tp.State(model=model, temperature=temperature, optimizer=optimizer)

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(state.model(x) * state.temperature, y)


class LazyOptimizer(MLP):
    """The optimizer is built in the first step() (None right after setup())."""

    def setup(self) -> tp.State:
        return tp.State(model=self.model(), optimizer=None)

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        if state.optimizer is None:
            state.optimizer = self.optimizer(state.model)
        return super().step(state, batch)


class NoOptimizer(MLP):
    """The optimizer is kept outside the State: nothing to match the parameters to."""

    def setup(self) -> tp.State:
        model = self.model()
        self._optimizer = self.optimizer(model)
        return tp.State(model=model)

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        loss = self.loss(state, batch)
        self._optimizer.zero_grad()
        loss.backward()
        self._optimizer.step()
        return loss.detach()


class Raises(MLP):
    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        raise ValueError("the data pipeline broke")


# -- weight tying ------------------------------------------------------------------------------------


class TinyGPT(nn.Module):
    """GPT-shaped: token and position embeddings, an MLP block, a final LayerNorm, and an lm_head whose weight
    is the token embedding's."""

    def __init__(self, vocab: int = 32, width: int = 16, context: int = 8) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(vocab, width),
            "wpe": nn.Embedding(context, width),
            "mlp": nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)),
            "ln_f": nn.LayerNorm(width),
        })
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.transformer["wte"].weight = self.lm_head.weight  # weight tying, as nanoGPT does

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.transformer["wte"](idx) + self.transformer["wpe"](torch.arange(idx.shape[1]))
        h = self.transformer["ln_f"](h + self.transformer["mlp"](h))
        logits: torch.Tensor = self.lm_head(h)
        return logits


class GPT(MLP):
    """Clean: nanoGPT's configure_optimizers (decay for 2-D parameters, none for the others) on tied weights."""

    def model(self) -> nn.Module:
        return TinyGPT()

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        parameters = {name: p for name, p in model.named_parameters() if p.requires_grad}
        groups = [{"params": [p for p in parameters.values() if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in parameters.values() if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=1e-3)

    def batches(self, state: tp.State) -> Iterator[Batch]:
        generator = torch.Generator().manual_seed(0)
        while True:
            tokens = torch.randint(0, 32, (4, 9), generator=generator)
            yield tokens[:, :-1], tokens[:, 1:]

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        idx, targets = batch
        logits = state.model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class GPTHeadFrozen(GPT):
    """Freezing the lm_head also freezes the tied token embedding, which the optimizer still holds."""

    def model(self) -> nn.Module:
        model = TinyGPT()
        model.lm_head.requires_grad_(False)
        return model

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=1e-3)


# -- mixed precision -----------------------------------------------------------------------------------


class Amp(MLP):
    """Clean: autocast (bfloat16 on CPU), a CPU GradScaler, unscale_ before clipping, scaler.step, update."""

    def __init__(self, init_scale: float = 1024.0) -> None:
        self.init_scale = init_scale

    def setup(self) -> tp.State:
        state = super().setup()
        state.scaler = torch.amp.GradScaler("cpu", init_scale=self.init_scale)
        return state

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = state.model(x)
        return F.mse_loss(out.float(), y)

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        loss = self.loss(state, batch)
        state.optimizer.zero_grad()
        state.scaler.scale(loss).backward()
        self.update(state)
        return loss.detach()

    def update(self, state: tp.State) -> None:
        state.scaler.unscale_(state.optimizer)
        nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=1.0)
        state.scaler.step(state.optimizer)
        state.scaler.update()


class StepsOptimizerDirectly(Amp):
    """optimizer.step() where scaler.step(optimizer) belongs, on still-scaled gradients, and no update()."""

    def update(self, state: tp.State) -> None:
        state.optimizer.step()


class StepsAfterUnscale(Amp):
    """unscale_ and clipping right, then optimizer.step() instead of scaler.step(); update() still called."""

    def update(self, state: tp.State) -> None:
        state.scaler.unscale_(state.optimizer)
        nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=1.0)
        state.optimizer.step()
        state.scaler.update()


class StepsDirectlyThenUpdates(Amp):
    """optimizer.step() instead of scaler.step(), then scaler.update(): the GradScaler raises in update()."""

    def update(self, state: tp.State) -> None:
        state.optimizer.step()
        state.scaler.update()


class StepsDirectlyThenRaises(Amp):
    """optimizer.step() instead of scaler.step(), then an error of the recipe's own."""

    def update(self, state: tp.State) -> None:
        state.optimizer.step()
        raise ValueError("the logger broke")


class UpdateMissing(Amp):
    """scaler.step() without scaler.update()."""

    def update(self, state: tp.State) -> None:
        state.scaler.unscale_(state.optimizer)
        state.scaler.step(state.optimizer)


class ClipsBeforeUnscale(Amp):
    """Clipping on the scaled gradients, then scaler.step()."""

    def update(self, state: tp.State) -> None:
        nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=1.0)
        state.scaler.step(state.optimizer)
        state.scaler.update()


def infinite_gradient(model: nn.Module) -> torch.Tensor:
    """A term worth 0 whose gradient is infinite: sqrt(w - w) at 0."""
    weight = model[0].weight
    return torch.sqrt(weight - weight.detach()).sum()


class InfiniteGradients(Amp):
    """The loss is finite, its gradient is not: the GradScaler skips every step."""

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        return super().loss(state, batch) + infinite_gradient(state.model)


class InfiniteGradientsNoScaler(MLP):
    """The same gradient without a GradScaler: AdamW steps on it."""

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        return super().loss(state, batch) + infinite_gradient(state.model)


class InfiniteGradientsInClosure(MLP):
    """The same gradient computed inside `optimizer.step(closure)`: the step itself makes the gradient it takes."""

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        def closure() -> torch.Tensor:
            state.optimizer.zero_grad()
            loss = self.loss(state, batch) + infinite_gradient(state.model)
            loss.backward()
            return loss

        return state.optimizer.step(closure).detach()  # type: ignore[union-attr]


class ZeroGated(nn.Module):
    """The MLP plus a branch behind a gate initialized to zero (ReZero, LoRA's zero-initialized B): at the first step
    the branch's gradient is exactly zero."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()
        self.branch = nn.Linear(8, 1)
        self.gate = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.gate * self.branch(x)  # type: ignore[no-any-return]


def normalize_gradients(model: nn.Module) -> None:
    """Each gradient divided by its own norm, with no eps: an all-zero gradient becomes 0 / 0 = NaN."""
    for parameter in model.parameters():
        if parameter.grad is not None:
            parameter.grad = parameter.grad / parameter.grad.norm()


class NormalizesGradientsAfterUnscale(Amp):
    """After scaler.unscale_(), every gradient divided by its norm by hand: the zero-gated branch's all-zero gradient
    becomes NaN after the GradScaler's inf check, which scaler.step() trusts: it steps on the NaN."""

    def model(self) -> nn.Module:
        return ZeroGated()

    def update(self, state: tp.State) -> None:
        state.scaler.unscale_(state.optimizer)
        normalize_gradients(state.model)
        state.scaler.step(state.optimizer)
        state.scaler.update()


class NormalizesGradientsAfterUnscaleFused(NormalizesGradientsAfterUnscale):
    """The same with a fused AdamW, which scaler.step() always calls, telling it the inf check's result
    (`optimizer.found_inf`): that check found nothing, so it steps on the NaN too."""

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)


class NormalizesGradientsNoScaler(MLP):
    """Every gradient divided by its norm by hand, no GradScaler: AdamW steps on the zero-gated branch's NaN."""

    def model(self) -> nn.Module:
        return ZeroGated()

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        loss = self.loss(state, batch)
        state.optimizer.zero_grad()
        loss.backward()
        normalize_gradients(state.model)
        state.optimizer.step()
        return loss.detach()


class InfiniteGradientsFused(InfiniteGradients):
    """Infinite gradients with a fused AdamW: scaler.step() calls it on them with found_inf set, and it skips the
    update itself."""

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)


class NanLoss(Amp):
    """A log of 0 in the loss from step 2 on."""

    def setup(self) -> tp.State:
        state = super().setup()
        state.calls = 0
        return state

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        state.calls += 1
        loss = super().loss(state, batch)
        return loss if state.calls < 2 else loss * torch.log(torch.zeros(()))


class NanInit(MLP):
    """A NaN in the initial weights."""

    def model(self) -> nn.Module:
        model = mlp()
        with torch.no_grad():
            model[2].bias.fill_(float("nan"))
        return model


class DisabledScaler(StepsOptimizerDirectly):
    """GradScaler(enabled=False): every call passes through, so optimizer.step() is fine."""

    def setup(self) -> tp.State:
        state = super().setup()
        state.scaler = torch.amp.GradScaler("cpu", enabled=False)
        return state

    def step(self, state: tp.State, batch: Batch) -> Any:
        loss = super().step(state, batch)
        state.scaler.update()
        return loss


class LazyNet(nn.Module):
    """Lazy layers, given their sizes by the first forward pass: a body, and an auxiliary head that runs when
    `use_aux` and takes no part in the output."""

    def __init__(self, use_aux: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.Linear(16, 1))
        self.aux = nn.LazyLinear(3)
        self.use_aux = use_aux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_aux:
            self.aux(x)
        return self.body(x)  # type: ignore[no-any-return]


class LazyModel(MLP):
    """Clean: the optimizer holds lazy parameters that no forward pass has given a size yet (as torch allows); the
    auxiliary head is given one by `setup()` and frozen."""

    def __init__(self, accumulation_steps: int = 1) -> None:
        self.accumulation_steps = accumulation_steps

    def model(self) -> nn.Module:
        model = LazyNet(use_aux=False)
        model.aux(torch.zeros(1, 8))
        model.aux.requires_grad_(False)
        return model

    def setup(self) -> tp.State:
        state = super().setup()
        state.micro = 0
        return state

    def batches(self, state: tp.State) -> Iterator[Batch]:
        cursor = state.micro // self.accumulation_steps  # a resumed run goes on where the checkpoint left
        while True:
            generator = torch.Generator().manual_seed(cursor)
            yield torch.randn(8, 8, generator=generator), torch.randn(8, 1, generator=generator)
            cursor += 1

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        loss = self.loss(state, batch) / self.accumulation_steps
        loss.backward()
        state.micro += 1
        if state.micro % self.accumulation_steps == 0:
            state.optimizer.step()
            state.optimizer.zero_grad()
        return loss.detach()


class LazyUnusedHead(MLP):
    """The lazy auxiliary head runs in every forward pass (which sizes it) and never reaches the loss."""

    def model(self) -> nn.Module:
        return LazyNet(use_aux=True)


class WithEma(MLP):
    """Clean: an exponential moving average of the model (torch's AveragedModel, a copy whose parameters still
    require grad), updated after every step."""

    def setup(self) -> tp.State:
        state = super().setup()
        state.ema = torch.optim.swa_utils.AveragedModel(
            state.model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))  # type: ignore[no-untyped-call]
        return state

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        loss = super().step(state, batch)
        state.ema.update_parameters(state.model)
        return loss


class WithEmaHeadNotOptimized(WithEma, HeadNotOptimized):
    """The averaged copy beside a head that no optimizer holds."""
