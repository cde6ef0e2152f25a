"""Checks on training scripts as they are, run as real processes and observed through hooks
installed before their first line (`_hook`): `check_resume_script` (`_resume`) and
`check_runs_equivalent` (`_equivalent`), over the runs they share (`_runs`); a `torchrun` launch is observed on
every rank and joined into one trace (`_launch`)."""

from trainparity._script._equivalent import check_runs_equivalent
from trainparity._script._resume import check_resume_script
from trainparity._script._runs import Command

__all__ = ["Command", "check_resume_script", "check_runs_equivalent"]
