"""Preflight checks: one short observed run of the recipe, no comparison run.

- `check_optimizer_coverage` (`_optimizer_coverage.py`): which parameters the optimizers hold, and which
  got gradients;
- `check_mixed_precision` (`_mixed_precision.py`): the GradScaler's contract, and non-finite values;
- `check_frozen` (`_frozen.py`): frozen parameters and buffers stay put (`_watch.py`: the watch it shares with the
  optimizer coverage check);
- `check_train_mode` (`_train_mode.py`): modules that depend on their mode train in train mode, evaluations leave
  the training alone;
- `check_training` (`_training.py`): the run's telemetry per step (loss, gradient norm, update size, learning
  rates, skipped steps, non-finite values), the verdicts asked of it (`_training_verdicts.py`) and their judgement
  (`_training_judge.py`).

Each sets the recipe up from the seed and observes its `step()` calls through the one observer of
optimizer steps (`_run.py`, `_observe/_observer.py: Observer`), in-process by default; the run returns a typed
trace, which the check judges into a result of the usual form.
"""

from trainparity._preflight._frozen import check_frozen
from trainparity._preflight._mixed_precision import check_mixed_precision
from trainparity._preflight._optimizer_coverage import check_optimizer_coverage
from trainparity._preflight._train_mode import check_train_mode
from trainparity._preflight._training import check_training

__all__ = ["check_frozen", "check_mixed_precision", "check_optimizer_coverage", "check_train_mode", "check_training"]
