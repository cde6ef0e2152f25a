#!/usr/bin/env bash
# The nccl and CUDA paths of the checks on a machine with GPUs, in under 5 minutes:
#   bash tools/gpu_check.sh
# (resume with the rng.cuda stream, accumulation on CUDA, autocast coverage on CUDA, DDP on nccl and its resume
# from 2 ranks on 2 and on 1, with two GPUs or more).
set -euo pipefail
cd "$(dirname "$0")"
timeout 300 python gpu_check.py
