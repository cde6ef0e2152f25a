"""The nccl and CUDA paths of the checks, on one machine with GPUs (run by tools/gpu_check.sh).

Prints one line per check and exits 1 if a clean recipe does not PASS or a faulty one does not
FAIL with its cause. Needs CUDA; the parallel (DDP on nccl) and multi-rank resume parts need at least two
GPUs (one per rank). The autocast part: float16 autocast on a CUDA model passes (`CudaAutocast`, and the
example language model on the GPU), `torch.autocast("cpu")` around a CUDA model fails
`autocast_ineffective`.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import torch
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "test"), str(ROOT / "examples"), str(ROOT)]

import trainparity as tp  # noqa: E402


class CudaRegression(tp.Recipe):
    """AdamW on a CUDA MLP with dropout (the rng.cuda stream); `forget_cuda_rng` loses it on load."""

    def __init__(self, forget_cuda_rng: bool = False) -> None:
        self.forget_cuda_rng = forget_cuda_rng

    def setup(self) -> tp.State:
        model = nn.Sequential(nn.Linear(16, 64), nn.Dropout(0.2), nn.Linear(64, 1)).cuda()
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), step=0)

    def batches(self, state: tp.State) -> Any:
        generator = torch.Generator().manual_seed(0)
        data = torch.randn(256, 16, generator=generator)
        index = state.step
        while True:
            ids = torch.arange(8) + 8 * (index % 32)
            yield ids, data[ids].cuda()
            index += 1

    def sample_ids(self, batch: Any) -> torch.Tensor:
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        loss = state.model(batch[1]).pow(2).mean()
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        state.step += 1
        return loss.detach()

    def load(self, path: pathlib.Path) -> tp.State:
        state = super().load(path)
        if self.forget_cuda_rng:
            torch.cuda.manual_seed_all(12345)
        return state


class CudaDDP(CudaRegression):
    """The same model wrapped in DistributedDataParallel on cuda:<rank>; `no_ddp` leaves it unwrapped."""

    def __init__(self, no_ddp: bool = False) -> None:
        super().__init__()
        self.no_ddp = no_ddp

    def setup(self) -> tp.State:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        model: nn.Module = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)).cuda()
        if not self.no_ddp:
            model = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        return tp.State(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), step=0)

    def batches(self, state: tp.State) -> Any:
        for ids, x in super().batches(state):
            yield ids[self.rank::self.world], x[self.rank::self.world]


class CudaAutocast(tp.Recipe):
    """A small MLP on the GPU under float16 autocast with a GradScaler; `region` is the device type the autocast
    region names ("cpu": autocast that changes nothing on CUDA tensors)."""

    autocast_dtype = torch.float16

    def __init__(self, region: str = "cuda") -> None:
        self.region = region

    def setup(self) -> tp.State:
        model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 1)).cuda()
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                        scaler=torch.amp.GradScaler("cuda"))

    def batches(self, state: tp.State) -> Any:
        generator = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(32, 64, generator=generator).cuda(), torch.randn(32, 1, generator=generator).cuda()

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        x, y = batch
        dtype = torch.float16 if self.region == "cuda" else torch.bfloat16
        with torch.autocast(self.region, dtype=dtype):
            loss = nn.functional.mse_loss(state.model(x).float(), y)
        state.optimizer.zero_grad()
        state.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        state.scaler.step(state.optimizer)
        state.scaler.update()
        return loss.detach()


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    failures = []

    def expect(name: str, result: tp.Result, outcome: tp.Outcome, path: str | None = None) -> None:
        first = result.first_violation
        ok = result.outcome is outcome and (path is None or (first is not None and first.path == path))
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {result.outcome.value}"
              + (f" at {first.path}" if first is not None else ""), flush=True)
        if not ok:
            failures.append(result.report())

    gpu_check = "gpu_check:CudaRegression"
    expect("resume on CUDA, clean", tp.check_resume(gpu_check, isolation="spawn"), tp.Outcome.PASS)
    expect("resume on CUDA, rng.cuda lost", tp.check_resume(f"{gpu_check}(forget_cuda_rng=True)",
                                                             isolation="spawn"), tp.Outcome.FAIL, "rng.cuda")
    expect("accumulation on CUDA", tp.check_accumulation(gpu_check, isolation="spawn", disable_dropout=True),
           tp.Outcome.PASS)
    expect("autocast('cuda') on a CUDA model", tp.check_mixed_precision("gpu_check:CudaAutocast"), tp.Outcome.PASS)
    expect("autocast('cpu') around a CUDA model", tp.check_mixed_precision("gpu_check:CudaAutocast(region='cpu')"),
           tp.Outcome.FAIL, "autocast.CudaAutocast.step")
    expect("the example language model on CUDA, float16 autocast",
           tp.check_mixed_precision("autocast_lm:AutocastLM(device='cuda')", steps=2), tp.Outcome.PASS)
    gpus = torch.cuda.device_count()
    if gpus >= 2:
        expect("DDP on nccl, clean", tp.check_parallel("gpu_check:CudaDDP", world_size=2, backend="nccl"),
               tp.Outcome.PASS)
        expect("DDP on nccl, no DDP wrapper", tp.check_parallel("gpu_check:CudaDDP(no_ddp=True)",
                                                                 world_size=2, backend="nccl"),
               tp.Outcome.FAIL)
        for resume_world_size in (2, 1):
            expect(f"resume of DDP on nccl, 2 ranks then {resume_world_size}",
                   tp.check_resume("gpu_check:CudaDDP", world_size=2, resume_world_size=resume_world_size,
                                   backend="nccl"), tp.Outcome.PASS)
    else:
        print(f"skipped: DDP on nccl needs two GPUs, {gpus} visible")
    for report in failures:
        print(report)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
