"""`python -m trainparity`: run a check from a shell and exit with its outcome.

Recipes and coverage functions are named by specs: `package.module:Name`,
`path/to/file.py:Name`, either with literal arguments, `module:Name(k=1, name="x")` (the
form reports print), parsed without evaluating anything but literals.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import inspect
import os
import pathlib
import platform
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from trainparity._recipe._spec import Spec, SpecError, load_spec, parse_spec
from trainparity._results._result import (
    AccumulationResult,
    CoverageResult,
    DataParallelResult,
    FrozenResult,
    MixedPrecisionResult,
    OptimizerCoverageResult,
    Result,
    ResumeResult,
    TrainingResult,
    TrainModeResult,
    WorkerRandomnessResult,
)
from trainparity._results._violation import ChildError, Outcome
from trainparity._state._compare import ToleranceComparison
from trainparity._validation import InvalidArgument
from trainparity._version import __version__

EXIT_CODES = {Outcome.PASS: 0, Outcome.FAIL: 1, Outcome.ABSTAIN: 2, Outcome.ERROR: 3}
USAGE_ERROR = 4
INTERNAL_ERROR = 5
EXIT_STATUS_HELP = """\
exit status:
  0  PASS
  1  FAIL: a divergence was found (the report names the first)
  2  ABSTAIN: the evidence is missing or ambiguous (e.g. the baseline is not reproducible)
  3  ERROR: the user's code raised (importing the recipe included), hung past --timeout, or its process died
  4  usage error, or a spec or --json path that cannot be used (one line on stderr, no traceback)
  5  a bug in trainparity itself: its traceback on stderr (please report it)
"""
RECIPE_HELP = ("the recipe: package.module:ClassName or path/to/file.py:ClassName, optionally with literal "
               "constructor arguments, e.g. 'module:Regression(forget_scheduler=True)'")
TIMEOUT_HELP = "seconds the whole check may take, all its runs included, before it ends in ERROR (default: 120)"
SCRIPT_TIMEOUT_HELP = "seconds the whole check may take, every run of the script included (default: %(default)s)"
JSON_HELP = "also write the result as JSON to FILE (checked to be writable before the check runs)"


class UsageError(Exception):
    """A command line that cannot run: exit status 4 with one line on stderr."""


def command_checks() -> dict[str, Callable[..., Result]]:
    """The check each command runs: its options are the check's keywords, with the check's own defaults."""
    import trainparity as tp

    return {"resume": tp.check_resume, "accumulation": tp.check_accumulation, "data-parallel": tp.check_data_parallel,
            "optimizer-coverage": tp.check_optimizer_coverage, "mixed-precision": tp.check_mixed_precision,
            "frozen": tp.check_frozen, "train-mode": tp.check_train_mode, "training": tp.check_training,
            "resume-script": tp.check_resume_script, "equivalent": tp.check_runs_equivalent,
            "coverage": tp.check_coverage, "worker-randomness": tp.check_worker_randomness}


#: keywords of a check that no option of the same name carries, and how the command line expresses them
EXPRESSED_OTHERWISE = {
    "comparison": "--rtol and --atol (a tp.ToleranceComparison; exact without them)",
    "disable_dropout": "--keep-dropout (disable_dropout=False)",
    "split": "not on the command line: a function (the default tp.split_batch)",
    "policy": "the coverage function returns the policy with the ranks",
    "sample_ids": "the coverage function returns it with the ranks",
    "env": "not on the command line: the command inherits this shell's environment",
    "cwd": "not on the command line: the command runs in this shell's directory",
}


class _Parser(argparse.ArgumentParser):
    #: the keyword defaults of the check the command runs (`command_checks`): an option named after a keyword
    #: takes the check's default, so that the two cannot drift apart
    keyword_defaults: dict[str, Any] = {}

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")

    def runs(self, check: Callable[..., Result]) -> None:
        parameters = inspect.signature(check).parameters.items()
        self.keyword_defaults = {name: parameter.default for name, parameter in parameters
                                 if parameter.kind is inspect.Parameter.KEYWORD_ONLY
                                 and parameter.default is not inspect.Parameter.empty}

    def add_argument(self, *flags: Any, **options: Any) -> argparse.Action:
        dest = options.get("dest") or (flags[0].lstrip("-").replace("-", "_") if flags and flags[0].startswith("--")
                                       else None)
        if dest in self.keyword_defaults and "default" not in options and not options.get("required"):
            options["default"] = self.keyword_defaults[dest]
        return super().add_argument(*flags, **options)


def _errored(cls: type[Result], phase: str, error: BaseException, config: dict[str, Any]) -> Result:
    """The ERROR result for the user's code raising in this process (importing a module, calling a function)."""
    from trainparity._process._child import error_record

    return cls.errored(ChildError.raised(error_record(error), phase), config)


@dataclasses.dataclass(frozen=True)
class Command:
    """What a command runs: a check on the object its spec names (a recipe check passes the spec itself on; a
    "function" spec is called with its arguments, and the check gets what it returns), reported as
    `result_type`."""

    run: Callable[[argparse.Namespace, Spec, Any], Result]
    result_type: type[Result]
    #: the spec's form in messages, and its key in the config of an ERROR result
    shape: str = "package.module:ClassName"
    key: str = "recipe"

    def __call__(self, args: argparse.Namespace) -> Result:
        """Load the spec's object (an ERROR result when its module raises), then run the check."""
        spec = parse_spec(args.spec, self.shape)
        try:
            loaded = load_spec(spec)
        except SpecError:
            raise
        except Exception as error:  # noqa: BLE001 - the user's module raised (a SyntaxError included)
            return _errored(self.result_type, "import", error, {self.key: spec.text})
        if self.key == "function":
            if not callable(loaded):
                raise UsageError(f"{spec.text!r} is not a function (got {type(loaded).__name__})")
            try:
                loaded = loaded(*spec.args, **spec.kwargs)
            except Exception as error:  # noqa: BLE001 - the user's function raised
                return _errored(self.result_type, f"{spec.qualname}()", error, {self.key: spec.text})
        return self.run(args, spec, loaded)


def _tolerance(args: argparse.Namespace) -> ToleranceComparison | None:
    if args.rtol is None and args.atol is None:
        return None
    return ToleranceComparison(rtol=args.rtol or 0.0, atol=args.atol or 0.0)


def _run_resume(args: argparse.Namespace, spec: Spec, _recipe: object) -> Result:
    from trainparity._resume import check_resume

    return check_resume(spec.text, steps=args.steps, resume_at=args.resume_at, comparison=_tolerance(args),
                        seed=args.seed, isolation=args.isolation, timeout=args.timeout, world_size=args.world_size,
                        resume_world_size=args.resume_world_size, backend=args.backend, precision=args.precision)


def _microbatches(text: str) -> int | tuple[int, ...]:
    """`4` (equal parts) or `3,3,2` (declared sizes)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an int or comma-separated sizes such as 3,3,2, got {text!r}"
        ) from None
    return values[0] if len(values) == 1 else values


def _run_accumulation(args: argparse.Namespace, spec: Spec, _recipe: object) -> Result:
    from trainparity._accumulation import check_accumulation

    return check_accumulation(spec.text, microbatches=args.microbatches, cycles=args.cycles,
                              comparison=_tolerance(args), seed=args.seed, precision=args.precision,
                              disable_dropout=not args.keep_dropout, batch_dependent=args.batch_dependent,
                              isolation=args.isolation, timeout=args.timeout)


def _run_data_parallel(args: argparse.Namespace, spec: Spec, _recipe: object) -> Result:
    from trainparity._parallel import check_data_parallel

    return check_data_parallel(spec.text, world_size=args.world_size, backend=args.backend, steps=args.steps,
                               comparison=_tolerance(args), seed=args.seed, precision=args.precision,
                               timeout=args.timeout, isolation=args.isolation)


def _run_optimizer_coverage(args: argparse.Namespace, spec: Spec, _recipe: object) -> Result:
    from trainparity._preflight import check_optimizer_coverage

    return check_optimizer_coverage(spec.text, steps=args.steps, seed=args.seed, isolation=args.isolation,
                                    timeout=args.timeout)


def _run_mixed_precision(args: argparse.Namespace, spec: Spec, _recipe: object) -> Result:
    from trainparity._preflight import check_mixed_precision

    return check_mixed_precision(spec.text, steps=args.steps, max_skipped_steps=args.max_skipped_steps,
                                 allow_float32=args.allow_float32, max_float32_share=args.max_float32_share,
                                 seed=args.seed, isolation=args.isolation, timeout=args.timeout)


def _run_frozen(args: argparse.Namespace, spec: Spec, _recipe: object) -> Result:
    from trainparity._preflight import check_frozen

    return check_frozen(spec.text, frozen=args.frozen, steps=args.steps, seed=args.seed, isolation=args.isolation,
                        timeout=args.timeout)


def _run_train_mode(args: argparse.Namespace, spec: Spec, _recipe: object) -> Result:
    from trainparity._preflight import check_train_mode

    return check_train_mode(spec.text, steps=args.steps, eval_modules=args.eval_modules, seed=args.seed,
                            isolation=args.isolation, timeout=args.timeout)


def _update_band(text: str) -> tuple[float, float] | bool:
    """`default` (the documented band) or `LOW,HIGH`."""
    if text == "default":
        return True
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH such as 1e-4,1e-2, or default, got {text!r}") from None
    return low, high


def _lr_schedule(text: str) -> list[float] | Callable[[int], Any]:
    """Comma-separated learning rates, one per optimizer step, or a `package.module:function` of the step's index."""
    if ":" in text:
        function = load_spec(parse_spec(text, "package.module:function"))
        if not callable(function):
            raise UsageError(f"--lr-schedule {text!r} is not a function (got {type(function).__name__})")
        schedule: Callable[[int], Any] = function
        return schedule
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--lr-schedule: expected comma-separated learning rates such as 0.001,0.002, or "
                         f"package.module:function, got {text!r}") from None


def _run_training(args: argparse.Namespace, spec: Spec, _recipe: object) -> Result:
    from trainparity._preflight import check_training

    try:
        schedule = None if args.lr_schedule is None else _lr_schedule(args.lr_schedule)
    except (UsageError, SpecError):
        raise
    except Exception as error:  # noqa: BLE001 - the schedule's module raised
        return _errored(TrainingResult, "import", error, {"recipe": spec.text, "lr_schedule": args.lr_schedule})
    return check_training(spec.text, steps=args.steps, seed=args.seed, isolation=args.isolation, timeout=args.timeout,
                          min_decrease=args.min_decrease, window=args.window, overfit=args.overfit,
                          overfit_fraction=args.overfit_fraction, max_grad_norm=args.max_grad_norm,
                          update_ratio=args.update_ratio, lr_schedule=schedule,
                          max_skipped_steps=args.max_skipped_steps, max_loss_growth=args.max_loss_growth)


def _run_coverage(args: argparse.Namespace, spec: Spec, returned: object) -> Result:
    from trainparity._coverage import check_coverage

    if not (isinstance(returned, tuple) and len(returned) in (2, 3)):
        raise UsageError(f"{spec.text} must return (ranks, policy) or (ranks, policy, sample_ids), "
                         f"got {type(returned).__name__}")
    ranks, policy, *sample_ids = returned
    return check_coverage(ranks, policy=policy, sample_ids=sample_ids[0] if sample_ids else None,
                          max_violations=args.max_violations, timeout=args.timeout)


def _run_worker_randomness(args: argparse.Namespace, spec: Spec, loader: Any) -> Result:
    from trainparity._workers import check_worker_randomness

    return check_worker_randomness(loader, epochs=args.epochs, batches=args.batches, timeout=args.timeout)


def _run_resume_script(args: argparse.Namespace) -> Result:
    from trainparity._script import check_resume_script

    return check_resume_script(args.run, args.resume, steps=args.steps, resume_at=args.resume_at,
                               comparison=_tolerance(args), timeout=args.timeout)


def _run_equivalent(args: argparse.Namespace) -> Result:
    from trainparity._script import check_runs_equivalent

    return check_runs_equivalent(args.reference, args.candidate, steps=args.steps, comparison=_tolerance(args),
                                 timeout=args.timeout)


def _require_writable(path: pathlib.Path) -> None:
    """Refuse a --json path that cannot be written before the check runs, not after."""
    directory = path.parent
    if path.is_dir():
        why = os.strerror(errno.EISDIR)
    elif not directory.is_dir():
        why = os.strerror(errno.ENOENT)
    elif not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        why = os.strerror(errno.EACCES)
    else:
        return
    raise UsageError(f"cannot write --json {path}: {why}; pass a path in an existing, writable directory")


def _command(commands: Any, name: str, summary: str, command: Command) -> _Parser:
    parser: _Parser = commands.add_parser(name, help=summary, description=summary, epilog=EXIT_STATUS_HELP,
                                          formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.runs(command_checks()[name])
    parser.set_defaults(command_run=command)
    return parser


def _recipe_options(parser: argparse.ArgumentParser, isolations: Sequence[str], default_isolation: str, *,
                    tolerance: bool = True) -> None:
    add = parser.add_argument
    add("spec", metavar="recipe", help=RECIPE_HELP)
    add("--json", type=pathlib.Path, metavar="FILE", help=JSON_HELP)
    if tolerance:  # not for checks that compare no runs
        add("--rtol", type=float, metavar="R",
            help="declared relative tolerance (default: exact, or float64 mode's fixed tolerance where that applies)")
        add("--atol", type=float, metavar="A", help="declared absolute tolerance (default: as --rtol)")
    add("--seed", type=int, help="the seed of torch, numpy and random before setup() (default: %(default)s)")
    add("--isolation", choices=isolations,
        help="where each run executes: a child of the warmed fork server (process), a fresh interpreter "
             f"(spawn) or this process (inprocess) (default: {default_isolation})")
    add("--timeout", type=float, metavar="S", help=TIMEOUT_HELP)


def _precision_option(parser: argparse.ArgumentParser, default: str = "default") -> None:
    parser.add_argument("--precision", choices=("float64", "native"),
                        help=f"run in float64 and judge with its fixed tolerance ({default}), or in the recipe's "
                             "own dtypes")


def build_parser() -> argparse.ArgumentParser:
    import torch

    parser = _Parser(prog="python -m trainparity", description=__doc__.split("\n\n")[0], epilog=EXIT_STATUS_HELP,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    version = f"trainparity {__version__} (torch {torch.__version__}, Python {platform.python_version()})"
    parser.add_argument("--version", action="version", version=version)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    resume = _command(commands, "resume", "resume equivalence: save, exit, load in a fresh process and continue "
                      "like uninterrupted training", Command(_run_resume, ResumeResult))
    _recipe_options(resume, ("process", "spawn", "inprocess"), "process")
    resume.add_argument("--steps", type=int, help="steps of training compared (default: %(default)s)")
    resume.add_argument("--resume-at", type=int, metavar="K",
                        help="the step after which the run saves, exits and resumes (default: steps // 2)")
    resume.add_argument("--world-size", type=int,
                        help="ranks of every run but the resumed one; above 1, runs are worlds of real ranks "
                        "(default: %(default)s)")
    resume.add_argument("--resume-world-size", type=int, metavar="N",
                        help="ranks of the resumed run (default: --world-size)")
    resume.add_argument("--backend", help="torch.distributed backend: gloo (CPU) or nccl (default: gloo)")
    _precision_option(resume, "default when the world size changes; else native")

    accumulation = _command(commands, "accumulation", "accumulation equivalence: k micro-batches of accumulation "
                            "against one full-batch step", Command(_run_accumulation, AccumulationResult))
    _recipe_options(accumulation, ("inprocess", "process", "spawn"), "inprocess")
    add = accumulation.add_argument
    add("--microbatches", type=_microbatches, metavar="K|N,N,...",
        help="number of equal micro-batches, or their sizes (default: %(default)s)")
    add("--cycles", type=int, help="full batches compared (default: %(default)s)")
    add("--keep-dropout", action="store_true", help="leave dropout active (default: disabled in both runs)")
    _precision_option(accumulation)
    add("--batch-dependent", choices=("fail", "eval"),
        help="BatchNorm-like layers in training mode: FAIL on the divergence they cause (default), or run them "
             "in eval mode to judge the loop alone")

    parallel = _command(commands, "data-parallel", "data-parallel equivalence: real torch.distributed ranks "
                        "against the same recipe in a world of size 1", Command(_run_data_parallel, DataParallelResult))
    _recipe_options(parallel, ("process", "spawn"), "process; spawn for nccl")
    add = parallel.add_argument
    add("--world-size", type=int, help="number of ranks (default: %(default)s)")
    add("--backend", help="torch.distributed backend: gloo (CPU) or nccl (default: gloo)")
    add("--steps", type=int, help="steps of training compared (default: %(default)s)")
    _precision_option(parallel)

    coverage_of_optimizers = _command(
        commands, "optimizer-coverage", "optimizer coverage: every trainable parameter in exactly one optimizer "
        "group, frozen ones in none, every parameter reached by a gradient", Command(_run_optimizer_coverage,
                                                                                    OptimizerCoverageResult))
    _recipe_options(coverage_of_optimizers, ("inprocess", "process", "spawn"), "inprocess", tolerance=False)
    coverage_of_optimizers.add_argument("--steps", type=int,
                                        help="calls of step() observed after setup() (default: 1; 0: setup() only)")

    mixed = _command(commands, "mixed-precision", "mixed precision: the GradScaler's contract (scaler.step, update, "
                     "unscale_ before clipping, skipped steps), non-finite losses, gradients and parameters, and "
                     "autocast coverage (regions that lower nothing, ops run in float32 inside them)",
                     Command(_run_mixed_precision, MixedPrecisionResult))
    _recipe_options(mixed, ("inprocess", "process", "spawn"), "inprocess", tolerance=False)
    add = mixed.add_argument
    add("--steps", type=int, help="calls of step() observed (default: %(default)s)")
    add("--max-skipped-steps", type=int, metavar="N",
        help="optimizer steps the GradScaler may skip (default: half of its scaler.step() calls)")
    add("--allow-float32", action="append", metavar="GLOB",
        help="a module-name glob whose float32 matmuls inside autocast are deliberate, e.g. 'attn*' (repeatable)")
    add("--max-float32-share", type=float, metavar="F",
        help="the share of the matmul, convolution and attention FLOPs inside autocast regions that may run in "
             "float32 outside the allowed modules (default: %(default)s)")

    frozen = _command(commands, "frozen", "frozen parameters and buffers stay bitwise unchanged through a few steps, "
                      "and what moved one (a stale gradient, weight decay, a BatchNorm in train mode)",
                      Command(_run_frozen, FrozenResult))
    _recipe_options(frozen, ("inprocess", "process", "spawn"), "inprocess", tolerance=False)
    add = frozen.add_argument
    add("--frozen", action="append", metavar="GLOB",
        help="a glob over parameter and buffer names that are meant to stay frozen, e.g. 'backbone.*'; repeat it for "
             "several (default: the parameters with requires_grad=False after setup(), and the buffers of the modules "
             "whose parameters are all frozen)")
    add("--steps", type=int, help="calls of step() observed (default: %(default)s)")

    train_mode = _command(commands, "train-mode", "train/eval mode: the modules whose behaviour depends on their mode "
                          "train in train mode, and evaluations leave the training alone",
                          Command(_run_train_mode, TrainModeResult))
    _recipe_options(train_mode, ("inprocess", "process", "spawn"), "inprocess", tolerance=False)
    add = train_mode.add_argument
    add("--steps", type=int, help="calls of step() observed (default: %(default)s)")
    add("--eval-modules", action="append", metavar="GLOB",
        help="a glob over module names deliberately in eval mode (a frozen BatchNorm backbone), e.g. 'backbone'; "
             "a module inside a declared one is declared too; repeat it for several (default: none)")

    training = _command(commands, "training", "training health: one observed run, its loss, gradient norms, update "
                        "sizes, learning rates and skipped steps per step (printed as a table after the report), and "
                        "the verdicts asked for", Command(_run_training, TrainingResult))
    _recipe_options(training, ("inprocess", "process", "spawn"), "inprocess", tolerance=False)
    add = training.add_argument
    add("--steps", type=int, help="calls of step() observed (default: %(default)s)")
    add("--min-decrease", type=float, metavar="F",
        help="judge loss_not_decreasing: the median loss of the last --window steps must be below the first window's "
             "by this fraction of it, e.g. 0.1 (default: not judged)")
    add("--window", type=int, metavar="N",
        help="steps per window of --min-decrease (default: steps // 4)")
    add("--overfit", action="store_true",
        help="train on the recipe's first batch, repeated, and judge not_overfitting (default: the recipe's batches)")
    add("--overfit-fraction", type=float, metavar="F",
        help="with --overfit, the loss must fall below this fraction of its value at step 1 (default: %(default)s)")
    add("--max-grad-norm", type=float, metavar="N",
        help="judge grad_norm_exceeded: the gradient norm before clipping above N (default: not judged)")
    add("--update-ratio", type=_update_band, metavar="LOW,HIGH|default",
        help="judge update_too_small/update_too_large: ||update|| / ||parameters|| per parameter group outside "
             "[LOW, HIGH]; 'default' is 1e-5,0.1 (default: not judged)")
    add("--lr-schedule", metavar="LR,LR,...|module:function",
        help="judge lr_mismatch: the learning rate of each optimizer step against these rates (one per step), or a "
             "function of the step's index from 0 (default: not judged)")
    add("--max-skipped-steps", type=int, metavar="N",
        help="judge skipped_updates: more than N optimizer steps skipped by the GradScaler (default: not judged)")
    add("--max-loss-growth", type=float, metavar="G",
        help="judge loss_diverged: a loss above G times its start (at least 0.01), e.g. 100 (default: not judged)")

    script = commands.add_parser(
        "resume-script", help="resume equivalence of an unmodified training script, run as real processes",
        description="resume equivalence of an unmodified training script: two uninterrupted runs, one ended by a "
        "real exit right after the script's own first checkpoint at or after --resume-at, and --resume continuing "
        "from it", epilog=EXIT_STATUS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    script.set_defaults(command_run=_run_resume_script)
    script.runs(command_checks()["resume-script"])
    add = script.add_argument
    add("--run", required=True, metavar="COMMAND",
        help="the command that trains from scratch, split like a shell; {workdir} is a fresh directory per run "
             "chain (the interrupted and the resumed run share one)")
    add("--resume", required=True, metavar="COMMAND", help="the command that continues from the checkpoint")
    add("--steps", type=int, help="optimizer steps compared (default: %(default)s)")
    add("--resume-at", type=int, metavar="K",
        help="the run is ended after the script's first checkpoint at or after optimizer step K (default: %(default)s)")
    add("--rtol", type=float, metavar="R", help="declared relative tolerance (default: exact)")
    add("--atol", type=float, metavar="A", help="declared absolute tolerance (default: as --rtol)")
    add("--timeout", type=float, metavar="S", help=SCRIPT_TIMEOUT_HELP)
    add("--json", type=pathlib.Path, metavar="FILE", help=JSON_HELP)

    equivalent = commands.add_parser(
        "equivalent", help="two training commands that should train the same, compared optimizer step by step",
        description="two training commands that should train the same (a refactor, another launcher, another "
        "accumulation), compared optimizer step by step", epilog=EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    equivalent.set_defaults(command_run=_run_equivalent)
    equivalent.runs(command_checks()["equivalent"])
    add = equivalent.add_argument
    add("--reference", required=True, metavar="COMMAND",
        help="the command that trains as it should, split like a shell; {workdir} is a fresh directory per run")
    add("--candidate", required=True, metavar="COMMAND", help="the command that should train the same")
    add("--steps", type=int, required=True, help="optimizer steps compared")
    add("--rtol", type=float, metavar="R", help="declared relative tolerance (default: exact)")
    add("--atol", type=float, metavar="A", help="declared absolute tolerance (default: as --rtol)")
    add("--timeout", type=float, metavar="S", help=SCRIPT_TIMEOUT_HELP)
    add("--json", type=pathlib.Path, metavar="FILE", help=JSON_HELP)

    coverage = _command(commands, "coverage", "sample coverage: audit the sample IDs ranks read against a policy",
                        Command(_run_coverage, CoverageResult, "package.module:function", "function"))
    add = coverage.add_argument
    add("spec", metavar="function",
        help="package.module:function or path/to/file.py:function, optionally with literal arguments, returning "
             "(ranks, policy) or (ranks, policy, sample_ids): the arguments of tp.check_coverage")
    add("--json", type=pathlib.Path, metavar="FILE", help=JSON_HELP)
    add("--max-violations", type=int, metavar="N",
        help="list at most N violations (default: 1,000,000; the notes count them all)")
    add("--timeout", type=float, metavar="S",
        help="seconds the reading of the iterables may take before the check ends in ERROR (default: no limit)")

    workers = _command(commands, "worker-randomness", "worker randomness: DataLoader workers, or epochs, that draw the "
                       "same random numbers (augmentations)",
                       Command(_run_worker_randomness, WorkerRandomnessResult, "package.module:function", "function"))
    add = workers.add_argument
    add("spec", metavar="function",
        help="package.module:function or path/to/file.py:function, optionally with literal arguments, returning the "
             "torch.utils.data.DataLoader to check (a new one: the check starts its workers)")
    add("--json", type=pathlib.Path, metavar="FILE", help=JSON_HELP)
    add("--epochs", type=int, help="epochs of the loader iterated (default: %(default)s)")
    add("--batches", type=int, metavar="N", help="batches per epoch (default: whole epochs)")
    add("--timeout", type=float, metavar="S",
        help="seconds the whole check may take before it ends in ERROR and its workers are killed (default: no limit)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prog = f"python -m trainparity {args.command}"
    run: Callable[[argparse.Namespace], Result] = args.command_run
    try:
        if args.json is not None:
            _require_writable(args.json)
        result = run(args)
    except (UsageError, SpecError, InvalidArgument) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except Exception:  # noqa: BLE001 - not the user's misuse: a bug of ours, which must not look like a typo
        traceback.print_exc()
        print(f"{prog}: internal error: this is a bug in trainparity {__version__}, not in your command line or "
              "recipe; please report it with the traceback above", file=sys.stderr)
        return INTERNAL_ERROR
    print(result.report())
    if isinstance(result, TrainingResult) and result.telemetry:
        print(f"\n{result.table()}")
    if args.json is not None:
        try:
            args.json.write_text(result.to_json() + "\n")
        except OSError as error:  # not exit status 1 with a traceback: 1 means FAIL
            print(f"{prog}: error: cannot write --json {args.json}: {error.strerror or error}; pass a path in an "
                  "existing, writable directory", file=sys.stderr)
            return USAGE_ERROR
    return EXIT_CODES[result.outcome]
