"""Recipes for the autocast part of the mixed-precision check: each everyday form of autocast that does nothing,
and its fixed twin.

They build on `preflight_recipes.MLP` (AdamW, no GradScaler: bfloat16 needs none); `Net` is a small network with
a convolution, an attention and a head, so that every kind of op autocast lowers runs. The realistic forms, on a
transformer language model, are the faults of `examples/autocast_lm.py`.
"""

from __future__ import annotations

import pathlib
import sys
import warnings
from typing import Any

import torch
import torch.utils.checkpoint
from preflight_recipes import MLP, Batch, ClipsBeforeUnscale, mlp
from torch import nn
from torch.nn import functional as F

import trainparity as tp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

from autocast_lm import AutocastLM  # noqa: E402,F401  (the realistic forms, used by the tests from here)


class Bf16(MLP):
    """Clean: the forward under bfloat16 autocast on the tensors' device."""

    def device_type(self, x: torch.Tensor) -> str:
        return x.device.type

    def region(self, x: torch.Tensor) -> torch.autocast:
        return torch.autocast(self.device_type(x), dtype=torch.bfloat16)

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        with self.region(x):
            out = state.model(x)
        return F.mse_loss(out.float(), y)


class DeclaredBf16(Bf16):
    autocast_dtype = torch.bfloat16


class Checkpointed(DeclaredBf16):
    """Activation checkpointing: the backward recomputes the forward under the autocast state it saved."""

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        with self.region(x):
            out = torch.utils.checkpoint.checkpoint(state.model, x.requires_grad_(), use_reentrant=False)
        return F.mse_loss(out.float(), y)


class WrongDevice(DeclaredBf16):
    """`torch.autocast("cuda")` around a model on the CPU: torch turns it off with a warning."""

    def region(self, x: torch.Tensor) -> torch.autocast:
        return torch.autocast("cuda", dtype=torch.float16)


class WrongDeviceClipsBeforeUnscale(ClipsBeforeUnscale):
    """The GradScaler loop that clips before unscaling, its autocast on the wrong device too."""

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        with torch.autocast("cuda", dtype=torch.float16):
            out = state.model(x)
        return F.mse_loss(out.float(), y)


class WrongDeviceMadeInSetup(Bf16):
    """The wrong-device region made once in `setup()` (nanoGPT's `ctx`), entered by every `step()`."""

    def setup(self) -> tp.State:
        self.context = torch.autocast("cuda", dtype=torch.float16)
        return super().setup()

    def region(self, x: torch.Tensor) -> torch.autocast:
        return self.context


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch says here that it turns the region off: no CUDA on this machine

    class CudaAutocastForward(nn.Sequential):
        """A forward decorated for CUDA autocast when its class is defined, before any check starts."""

        @torch.autocast("cuda", dtype=torch.float16)
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = super().forward(x)
            return out


class CudaDecoratedForward(MLP):
    """On the CPU, a forward decorated with CUDA autocast: torch turned it off, and whether `enabled` was written
    True cannot be told from the object (a note)."""

    def model(self) -> nn.Module:
        return CudaAutocastForward(*mlp())


class CudaDecoratedForwardDeclared(CudaDecoratedForward):
    """The same, declaring bfloat16: the run lowered nothing, a FAIL."""

    autocast_dtype = torch.bfloat16


class Float32Loss(DeclaredBf16):
    """The common "loss in float32" form: a bfloat16 region for the body, then the head under a region disabled as
    written, in the same step: judged as the head under a nested disabled region is (a bypass, unless allowed)."""

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        with self.region(x):
            hidden = F.relu(state.model[0](x))
        with torch.autocast(x.device.type, enabled=False):
            out = state.model[2](hidden.float())
        return F.mse_loss(out, y)


class FlagOffBesideLoweredHead(DeclaredBf16):
    """The body under a region whose flag is off, the small head under bfloat16: the body's ops are bypasses."""

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=False):
            hidden = F.relu(state.model[0](x))
        with self.region(x):
            out = state.model[2](hidden)
        return F.mse_loss(out.float(), y)


class FlagOff(DeclaredBf16):
    """`enabled=` read from a config flag that is False, in a recipe that declares bfloat16."""

    amp = False

    def region(self, x: torch.Tensor) -> torch.autocast:
        return torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.amp)


class FlagOffUndeclared(FlagOff):
    """The same without a declared dtype: a float32 run by choice, a note."""

    autocast_dtype = None


class DeclaredWithoutAutocast(MLP):
    """Declares bfloat16, never enters autocast: every op runs in float32."""

    autocast_dtype = torch.bfloat16


class DeclaredBf16Model(DeclaredWithoutAutocast):
    """Declares bfloat16 and trains a bfloat16 model without autocast: the ops run in bfloat16."""

    def model(self) -> nn.Module:
        return mlp().to(torch.bfloat16)

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(state.model(x.to(torch.bfloat16)).float(), y)


class DisabledForward(nn.Sequential):
    """A model whose forward is decorated to run without autocast "for numerical stability"."""

    @torch.autocast("cpu", enabled=False)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = super().forward(x)
        return out


class ForwardDecoratedDisabled(DeclaredBf16):
    def model(self) -> nn.Module:
        return DisabledForward(*mlp())


class FloatInputs(DeclaredBf16):
    """`.float()` on the inputs of every matmul inside an enabled region: autocast casts them again."""

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        with self.region(x):
            hidden = F.relu(F.linear(x.float(), state.model[0].weight.float(), state.model[0].bias.float()))
            out = F.linear(hidden.float(), state.model[2].weight.float(), state.model[2].bias.float())
        return F.mse_loss(out.float(), y)


class Float64(DeclaredBf16):
    """A float64 model and inputs under autocast: autocast never lowers float64."""

    def model(self) -> nn.Module:
        return mlp().double()

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        with self.region(x):
            out = state.model(x.double())
        return F.mse_loss(out.float(), y)


class LossOnlyRegion(MLP):
    """Autocast around the loss only: it runs no op autocast lowers (a note, not a FAIL)."""

    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        x, y = batch
        out = state.model(x)
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return F.mse_loss(out, y)


class Float32Matmul(torch.autograd.Function):
    """x @ w.t() + b with `custom_fwd`; `cast_inputs` set by the subclass."""

    @staticmethod
    def run(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x, weight, bias = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            return torch.autograd.grad(x @ weight.t() + bias, (x, weight, bias), grad)


class CastsToFloat32(Float32Matmul):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight, bias)
        return Float32Matmul.run(x, weight, bias)


class KeepsAutocast(Float32Matmul):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight, bias)
        return Float32Matmul.run(x, weight, bias)


class CustomLinear(nn.Linear):
    function: Any = CastsToFloat32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.function.apply(x, self.weight, self.bias)
        return out


class KeepsAutocastLinear(CustomLinear):
    function = KeepsAutocast


class CustomFwdFloat32(DeclaredBf16):
    """Every layer a custom autograd function with `custom_fwd(cast_inputs=torch.float32)`."""

    layer: type[nn.Linear] = CustomLinear

    def model(self) -> nn.Module:
        return nn.Sequential(self.layer(8, 16), nn.ReLU(), self.layer(16, 1))


class CustomFwdKeepsAutocast(CustomFwdFloat32):
    """The twin: `custom_fwd` without `cast_inputs` runs its forward under the caller's autocast."""

    layer = KeepsAutocastLinear


class Net(nn.Module):
    """A convolution, an attention over the positions, a float32-sensitive head."""

    def __init__(self, float32_head: bool = False, float32_attention: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 8, 3, padding=1)
        self.attn = nn.Linear(8, 24)
        self.head = nn.Linear(8, 1)
        self.float32_head, self.float32_attention = float32_head, float32_attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x.reshape(-1, 2, 4)).transpose(1, 2)
        q, k, v = (t.unsqueeze(1) for t in self.attn(h).split(8, dim=-1))  # one head
        if self.float32_attention:
            q, k, v = q.float(), k.float(), v.float()
        with torch.autocast(x.device.type, enabled=not self.float32_attention):
            h = F.scaled_dot_product_attention(q, k, v).squeeze(1).mean(1)
        with torch.autocast(x.device.type, enabled=not self.float32_head):
            out: torch.Tensor = self.head(h.float() if self.float32_head else h)
        return out


class NetBf16(DeclaredBf16):
    """Clean: a convolution, scaled_dot_product_attention and linears in bfloat16."""

    float32_head = float32_attention = False

    def model(self) -> nn.Module:
        return Net(self.float32_head, self.float32_attention)


class Float32Head(NetBf16):
    """The head under a nested `autocast(enabled=False)`."""

    float32_head = True


class Float32Attention(NetBf16):
    """scaled_dot_product_attention under a nested `autocast(enabled=False)`."""

    float32_attention = True


class Float32AttentionAliased(Float32Attention):
    """`Float32Attention` whose State also holds the model's convolution as an entry of its own: one module reached
    from two entries."""

    def setup(self) -> tp.State:
        state = super().setup()
        state.conv = state.model.conv
        return state


class RaisesInRegion(Bf16):
    def loss(self, state: tp.State, batch: Batch) -> torch.Tensor:
        with self.region(batch[0]):
            state.model(batch[0])
            raise ValueError("the forward broke inside autocast")


class BadDeclaration(MLP):
    autocast_dtype = torch.float32




class BrokenHead(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("the head's forward broke")


class RaisesInAModuleForward(DeclaredBf16):
    """A declared recipe whose module raises in its forward: the watch is on while a State module runs."""

    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), BrokenHead(16, 1))
