"""Observing a recipe's `step()` calls without changing the user's code: the one observer of optimizer steps.

- `_observer`: `Observer`, the hooks and wrappers on one State's objects, undone on exit;
- `_records`: what it records per call (optimizer steps, clips, scaler steps, dropout, forward passes);
- `_watches` and `_forwards`: the watches a check hands the Observer: `DropoutOff`, `BatchDependentModules`, and
  `ForwardRecorder`, the forward passes of the State's modules (modes, buffers, RNG draws, mode switches);
- `_hooks`: what every observer shares (`HookSet`, gradient copies, the `creates_state` rule), the
  scripts' hook included.
"""
