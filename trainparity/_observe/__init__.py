"""Observing a recipe's `step()` calls without changing the user's code: the one observer of optimizer steps.

- `_observer`: `Observer`, the hooks and wrappers on one State's objects, undone on exit;
- `_records`: what it records per call (optimizer steps, clips, scaler steps, dropout, forward passes);
- `_forwards`: `ForwardRecorder`, the forward passes of the State's modules (modes, buffers, RNG draws, mode
  switches), installed by the Observer when asked;
- `_hooks`: what every observer shares (`HookSet`, gradient copies, the `creates_state` rule), the
  scripts' hook included.
"""
