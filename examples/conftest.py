"""Tiny models train faster on one thread than on two: set it before the checks start their processes.

The checks' fresh processes inherit the environment of the process that starts them.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after the environment variable, which torch reads when it loads)

torch.set_num_threads(1)
