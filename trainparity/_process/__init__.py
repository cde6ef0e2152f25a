"""The process engine: every run of a check, in a fresh process or this one, with its whole life cycle.

- `_engine`: `run_jobs`, the one entry: launches jobs, enforces deadlines, kills trees, reads outputs;
- `_launchers`: the parent's side of the warmed fork server, and fresh interpreters (`isolation="spawn"`);
- `_forkserver`: the warmed fork server itself; `_child`: what runs inside a child;
- `_wire`: the child-to-parent output format (JSON and raw bytes: reading it runs no code);
- `_tree`: killing a child's whole process tree; `_world`: joining and leaving a torch.distributed world;
- `_options`: the isolation and timeout every check validates alike;
- `_session`: the test session's defaults for those options, and its listeners.
- `_comparing`: what every comparison check (resume, accumulation, data parallel) resolves before its runs
  (`ComparisonSetup.prepare`), and how a run's error becomes its result.

Nothing is imported here, so that a check that needs only the session (coverage) does not load the engine.
"""
