"""A 2-cycle, k=4 accumulation check of the quickstart's small MLP, in-process, after import.

Prints torch's own one-time start-up (a first forward/backward/AdamW step/clip of an unrelated
model), then the first check (whose remaining extra time is the recipe's first calls at new
shapes), then the median of 10 more with torch's default intra-op threads and with one thread:
on a busy machine, threads that wait for a core dominate a model this small.
"""

from __future__ import annotations

import argparse

from benchmarks._timing import machine, median_seconds, seconds


def run(args: argparse.Namespace) -> None:
    import torch

    import trainparity as tp
    from trainparity.quickstarts.accumulation import Regression

    def check() -> None:
        result = tp.check_accumulation(Regression, microbatches=4, cycles=2)
        assert result.passed, result.report()

    def unrelated_first_step() -> None:
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.randn(3, 2)).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    print(f"accumulation check, small MLP, k=4, 2 cycles, in-process (target <= 0.1 s); {machine()}")
    print(f"torch's one-time start-up (first step of an unrelated model, no trainparity): "
          f"{seconds(unrelated_first_step):.3f} s")
    print(f"first check: {seconds(check):.3f} s")
    threads = torch.get_num_threads()
    for count in dict.fromkeys((threads, 1)):
        torch.set_num_threads(count)
        print(f"median of 10, torch threads={count}: {median_seconds(check, 10):.3f} s")
    torch.set_num_threads(threads)
