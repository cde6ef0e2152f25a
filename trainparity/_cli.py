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

from trainparity._deprecated import first_use, message
from trainparity._recipe._spec import Spec, SpecError, load_spec, parse_spec
from trainparity._results._result import Result, TrainingResult
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


#: keywords of a check that no option of the same name carries, and how the command line expresses them
EXPRESSED_OTHERWISE = {
    "comparison": "--rtol and --atol (a tp.ToleranceComparison; exact without them)",
    "split": "not on the command line: a function (the default tp.split_batch)",
    "policy": "the coverage function returns the policy with the ranks",
    "sample_ids": "the coverage function returns it with the ranks",
    "env": "not on the command line: the command inherits this shell's environment",
    "cwd": "not on the command line: the command runs in this shell's directory",
}


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of a command: the check keyword it sets and how argparse reads it. Its flag is the keyword's
    (`--resume-at` for `resume_at`) unless `flag` says otherwise; its default is the check's own."""

    keyword: str
    help: str
    type: Callable[[str], Any] | None = int
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    #: "append" (repeatable), "store_true" or "store_false" (a switch)
    action: str | None = None
    flag: str | None = None
    required: bool = False
    #: the text names the user's code (`module:function`): loaded when the command runs, its errors the user's
    loads: Callable[[str], Any] | None = None

    def add_to(self, parser: argparse.ArgumentParser, default: Any) -> None:
        options: dict[str, Any] = {"dest": self.keyword, "help": self.help}
        if self.action is not None:
            options["action"] = self.action
        else:
            options.update(type=self.type, metavar=self.metavar, choices=self.choices)
        if self.required:
            options["required"] = True
        elif default is not inspect.Parameter.empty:
            options["default"] = default
        parser.add_argument(self.flag or "--" + self.keyword.replace("_", "-"), **options)


def _recipe_options(isolations: tuple[str, ...], default_isolation: str) -> tuple[Option, ...]:
    return (
        Option("seed", "the seed of torch, numpy and random before setup() (default: %(default)s)"),
        Option("isolation", "where each run executes: a child of the warmed fork server (process), a fresh "
               f"interpreter (spawn) or this process (inprocess) (default: {default_isolation})", type=None,
               choices=isolations),
        Option("timeout", TIMEOUT_HELP, type=float, metavar="S"),
    )


def _precision(default: str = "default") -> Option:
    return Option("precision", f"run in float64 and judge with its fixed tolerance ({default}), or in the recipe's "
                  "own dtypes", type=None, choices=("float64", "native"))


def _script_options(timeout_help: str = SCRIPT_TIMEOUT_HELP) -> tuple[Option, ...]:
    return (Option("timeout", timeout_help, type=float, metavar="S"),)


ALL_ISOLATIONS = ("inprocess", "process", "spawn")
IGNORE_OPTION = Option("ignore", "a glob over State paths not compared, e.g. 'ema.*'; repeat it for several "
                       "(default: none)", type=None, action="append", metavar="GLOB")
STEPS_OBSERVED = "calls of step() observed (default: %(default)s)"


def _recipe(args: argparse.Namespace, spec: Spec, recipe: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (spec.text,), {}


def _coverage_arguments(args: argparse.Namespace, spec: Spec,
                        returned: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if not (isinstance(returned, tuple) and len(returned) in (2, 3)):
        raise UsageError(f"{spec.text} must return (ranks, policy) or (ranks, policy, sample_ids), "
                         f"got {type(returned).__name__}")
    ranks, policy, *sample_ids = returned
    return (ranks,), {"policy": policy, "sample_ids": sample_ids[0] if sample_ids else None}


def _loader(args: argparse.Namespace, spec: Spec, loader: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (loader,), {}


@dataclasses.dataclass(frozen=True)
class CheckCommand:
    """A command: the check it runs (by its name in `trainparity`), its options, and what its positional `spec`
    names, from which the check's positional arguments come (None: no spec; the options name the commands)."""

    name: str
    summary: str
    check: str
    options: tuple[Option, ...]
    arguments: Callable[[argparse.Namespace, Spec, Any], tuple[tuple[Any, ...], dict[str, Any]]] | None = _recipe
    spec_help: str = RECIPE_HELP
    #: the spec's form in messages, and its key in the config of an ERROR result
    shape: str = "package.module:ClassName"
    key: str = "recipe"
    #: --rtol and --atol: a declared tolerance (checks that compare runs)
    tolerance: bool = True
    description: str | None = None

    def function(self) -> Callable[..., Result]:
        import trainparity as tp

        check: Callable[..., Result] = getattr(tp, self.check)
        return check

    def checks(self) -> list[Callable[..., Result]]:
        return [self.function()]

    def result_type(self) -> type[Result]:
        """What the check returns, as its signature says: the type of an ERROR result made here."""
        returned: type[Result] = inspect.signature(self.function(), eval_str=True).return_annotation
        return returned

    def add_to(self, commands: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = commands.add_parser(
            self.name, help=self.summary, description=self.description or self.summary, epilog=EXIT_STATUS_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.set_defaults(command_run=self)
        if self.arguments is not None:
            parser.add_argument("spec", metavar=self.key, help=self.spec_help)
        parser.add_argument("--json", type=pathlib.Path, metavar="FILE", help=JSON_HELP)
        if self.tolerance:
            parser.add_argument("--rtol", type=float, metavar="R", help="declared relative tolerance (default: exact"
                                + (", or float64 mode's fixed tolerance where that applies)" if self.arguments
                                   else ")"))
            parser.add_argument("--atol", type=float, metavar="A", help="declared absolute tolerance (default: as "
                                "--rtol)")
        defaults = {name: parameter.default
                    for name, parameter in inspect.signature(self.function()).parameters.items()}
        for option in self.options:
            option.add_to(parser, defaults.get(option.keyword, inspect.Parameter.empty))
        return parser

    def __call__(self, args: argparse.Namespace) -> Result:
        """Load what the spec names and what the options name (an ERROR result when the user's code raises), then
        run the check."""
        keywords = {option.keyword: getattr(args, option.keyword) for option in self.options}
        positional: tuple[Any, ...] = ()
        if self.arguments is not None:
            spec = parse_spec(args.spec, self.shape)
            phase, named = "import", {}  # what the failing option named, shown in an ERROR result's config
            try:
                loaded = load_spec(spec)
                if self.key == "function":
                    if not callable(loaded):
                        raise UsageError(f"{spec.text!r} is not a function (got {type(loaded).__name__})")
                    phase = f"{spec.qualname}()"
                    loaded = loaded(*spec.args, **spec.kwargs)
                for option in self.options:
                    if option.loads is not None and keywords[option.keyword] is not None:
                        phase, named = "import", {option.keyword: keywords[option.keyword]}
                        keywords[option.keyword] = option.loads(keywords[option.keyword])
            except (UsageError, SpecError):
                raise
            except Exception as error:  # noqa: BLE001 - the user's module or function raised (a SyntaxError included)
                return _errored(self.result_type(), phase, error, {self.key: spec.text, **named})
            positional, extra = self.arguments(args, spec, loaded)
            keywords.update(extra)
        if self.tolerance:
            keywords["comparison"] = _tolerance(args)
        return self.function()(*positional, **keywords)


@dataclasses.dataclass(frozen=True)
class RecipesOrCommands:
    """One command for two checks of one question: two recipe specs given as positional arguments run `recipes`,
    `--reference` and `--candidate` commands run `commands`. Its options are both checks' keywords; where both take
    a keyword, its option defaults to None and each check keeps its own default."""

    recipes: CheckCommand
    commands: CheckCommand

    @property
    def name(self) -> str:
        return self.recipes.name

    def checks(self) -> list[Callable[..., Result]]:
        return [self.recipes.function(), self.commands.function()]

    @property
    def shared(self) -> set[str]:
        """The keywords both checks take: their options default to None, and a check called without them keeps its
        own default."""
        return {o.keyword for o in self.recipes.options} & {o.keyword for o in self.commands.options}

    def add_to(self, commands: Any) -> argparse.ArgumentParser:
        recipes = self.recipes
        description = (f"{recipes.summary}: `{self.name} REFERENCE CANDIDATE`, each recipe a spec such as "
                       f"'module:Recipe(checkpointing=True)'; or {self.commands.summary}: `{self.name} --reference "
                       "COMMAND --candidate COMMAND --steps N`")
        parser: argparse.ArgumentParser = commands.add_parser(
            self.name, help=f"{recipes.summary}; or two training commands", description=description,
            epilog=EXIT_STATUS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.set_defaults(command_run=self)
        parser.add_argument("recipes", nargs="*", metavar="RECIPE", help="the reference and the candidate recipe")
        parser.add_argument("--json", type=pathlib.Path, metavar="FILE", help=JSON_HELP)
        parser.add_argument("--rtol", type=float, metavar="R", help="declared relative tolerance (default: exact, or "
                            "float64 mode's fixed tolerance for recipes)")
        parser.add_argument("--atol", type=float, metavar="A", help="declared absolute tolerance (default: as --rtol)")
        shared = self.shared
        for command in (recipes, self.commands):
            defaults = {name: parameter.default
                        for name, parameter in inspect.signature(command.function()).parameters.items()}
            for option in command.options:
                if option.keyword in shared and command is self.commands:
                    continue
                option.add_to(parser, None if option.keyword in shared else defaults.get(option.keyword))
        return parser

    def __call__(self, args: argparse.Namespace) -> Result:
        own = {o.keyword for o in self.commands.options} - {o.keyword for o in self.recipes.options}
        if args.recipes:
            given = [f"--{keyword}" for keyword in sorted(own) if getattr(args, keyword) is not None]
            if len(args.recipes) != 2 or given:
                raise UsageError(f"give two recipes (the reference and the candidate), got {len(args.recipes)}"
                                 + (f", and {' and '.join(given)}, which name commands" if given else ""))
            command = self.recipes
            specs = [parse_spec(text, command.shape) for text in args.recipes]
            for key, spec in zip(("reference", "candidate"), specs, strict=True):
                try:
                    load_spec(spec)
                except SpecError:
                    raise
                except Exception as error:  # noqa: BLE001 - the user's module raised (a SyntaxError included)
                    return _errored(command.result_type(), "import", error, {key: spec.text})
            positional: tuple[Any, ...] = tuple(spec.text for spec in specs)
        else:
            missing = [f"--{keyword}" for keyword in ("reference", "candidate", "steps")
                       if getattr(args, keyword) is None]
            if missing:
                raise UsageError(f"give two recipes, or two commands with --reference, --candidate and --steps "
                                 f"(missing {', '.join(missing)})")
            command, positional = self.commands, ()
        keywords = {option.keyword: getattr(args, option.keyword) for option in command.options}
        keywords = {k: v for k, v in keywords.items() if v is not None or k not in self.shared}
        return command.function()(*positional, **keywords, comparison=_tolerance(args))


def _errored(cls: type[Result], phase: str, error: BaseException, config: dict[str, Any]) -> Result:
    """The ERROR result for the user's code raising in this process (importing a module, calling a function)."""
    from trainparity._process._child import error_record

    return cls.errored(ChildError.raised(error_record(error), phase), config)


def _tolerance(args: argparse.Namespace) -> ToleranceComparison | None:
    if args.rtol is None and args.atol is None:
        return None
    return ToleranceComparison(rtol=args.rtol or 0.0, atol=args.atol or 0.0)


def _microbatches(text: str) -> int | tuple[int, ...]:
    """`4` (equal parts) or `3,3,2` (declared sizes)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an int or comma-separated sizes such as 3,3,2, got {text!r}"
        ) from None
    return values[0] if len(values) == 1 else values


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


COMMANDS = (
    CheckCommand("resume", "resume equivalence: save, exit, load in a fresh process and continue like uninterrupted "
                 "training", "check_resume", (
                     *_recipe_options(ALL_ISOLATIONS[1:] + ("inprocess",), "process"),
                     Option("steps", "steps of training compared (default: %(default)s)"),
                     Option("resume_at", "the step after which the run saves, exits and resumes (default: steps // 2)",
                            metavar="K"),
                     Option("world_size", "ranks of every run but the resumed one; above 1, runs are worlds of real "
                            "ranks (default: %(default)s)"),
                     Option("resume_world_size", "ranks of the resumed run (default: --world-size)", metavar="N"),
                     Option("backend", "gloo (a process per rank, CPU), threads (every rank a thread of one process) "
                            "or nccl (default: gloo)", type=None),
                     _precision("default when the world size changes; else native"),
                     IGNORE_OPTION)),
    CheckCommand("accumulation", "accumulation equivalence: k micro-batches of accumulation against one full-batch "
                 "step", "check_accumulation", (
                     *_recipe_options(ALL_ISOLATIONS, "inprocess"),
                     Option("microbatches", "number of equal micro-batches, or their sizes (default: %(default)s)",
                            type=_microbatches, metavar="K|N,N,..."),
                     Option("cycles", "full batches compared (default: %(default)s)"),
                     Option("disable_dropout", "leave dropout active (default: disabled in both runs)",
                            action="store_false", flag="--keep-dropout"),
                     _precision(),
                     Option("batch_dependent", "BatchNorm-like layers in training mode: FAIL on the divergence they "
                            "cause (default), or run them in eval mode to judge the loop alone", type=None,
                            choices=("fail", "eval")),
                     IGNORE_OPTION)),
    CheckCommand("parallel", "parallel equivalence: real torch.distributed ranks against the same recipe in a world "
                 "of size 1", "check_parallel", (
                     *_recipe_options(("process", "spawn"), "process; spawn for nccl"),
                     Option("world_size", "number of ranks (default: %(default)s)"),
                     Option("backend", "gloo (a process per rank, CPU), threads (every rank a thread of one process) "
                            "or nccl (default: gloo)", type=None),
                     Option("steps", "steps of training compared (default: %(default)s)"),
                     _precision(),
                     IGNORE_OPTION)),
    CheckCommand("optimizer-coverage", "optimizer coverage: every trainable parameter in exactly one optimizer group, "
                 "frozen ones in none, every parameter reached by a gradient", "check_optimizer_coverage",
                 (
                     *_recipe_options(ALL_ISOLATIONS, "inprocess"),
                     Option("steps", "calls of step() observed after setup() (default: 1; 0: setup() only)")),
                 tolerance=False),
    CheckCommand("mixed-precision", "mixed precision: the GradScaler's contract (scaler.step, update, unscale_ before "
                 "clipping, skipped steps), non-finite losses, gradients and parameters, and autocast coverage "
                 "(regions that lower nothing, ops run in float32 inside them)", "check_mixed_precision",
                 (
                     *_recipe_options(ALL_ISOLATIONS, "inprocess"),
                     Option("steps", STEPS_OBSERVED),
                     Option("max_skipped_steps", "optimizer steps the GradScaler may skip (default: half of its "
                            "scaler.step() calls)", metavar="N"),
                     Option("allow_float32", "a module-name glob whose float32 matmuls inside autocast are deliberate, "
                            "e.g. 'attn*' (repeatable)", action="append", metavar="GLOB"),
                     Option("max_float32_share", "the share of the matmul, convolution and attention FLOPs inside "
                            "autocast regions that may run in float32 outside the allowed modules (default: "
                            "%(default)s)", type=float, metavar="F")),
                 tolerance=False),
    CheckCommand("frozen", "frozen parameters and buffers stay bitwise unchanged through a few steps, and what moved "
                 "one (a stale gradient, weight decay, a BatchNorm in train mode)", "check_frozen", (
                     *_recipe_options(ALL_ISOLATIONS, "inprocess"),
                     Option("frozen", "a glob over parameter and buffer names that are meant to stay frozen, e.g. "
                            "'backbone.*'; repeat it for several (default: the parameters with requires_grad=False "
                            "after setup(), and the buffers of the modules whose parameters are all frozen)",
                            action="append", metavar="GLOB"),
                     Option("steps", STEPS_OBSERVED)),
                 tolerance=False),
    CheckCommand("train-mode", "train/eval mode: the modules whose behaviour depends on their mode train in train "
                 "mode, and evaluations leave the training alone", "check_train_mode", (
                     *_recipe_options(ALL_ISOLATIONS, "inprocess"),
                     Option("steps", STEPS_OBSERVED),
                     Option("eval_modules", "a glob over module names deliberately in eval mode (a frozen BatchNorm "
                            "backbone), e.g. 'backbone'; a module inside a declared one is declared too; repeat it "
                            "for several (default: none)", action="append", metavar="GLOB")),
                 tolerance=False),
    CheckCommand("training", "training health: one observed run, its loss, gradient norms, update sizes, learning "
                 "rates and skipped steps per step (printed as a table after the report), and the verdicts asked "
                 "for", "check_training", (
                     *_recipe_options(ALL_ISOLATIONS, "inprocess"),
                     Option("steps", STEPS_OBSERVED),
                     Option("min_decrease", "judge loss_not_decreasing: the median loss of the last --window steps "
                            "must be below the first window's by this fraction of it, e.g. 0.1 (default: not "
                            "judged)", type=float, metavar="F"),
                     Option("window", "steps per window of --min-decrease (default: steps // 4)", metavar="N"),
                     Option("overfit", "train on the recipe's first batch, repeated, and judge not_overfitting "
                            "(default: the recipe's batches)", action="store_true"),
                     Option("overfit_fraction", "with --overfit, the loss must fall below this fraction of its value "
                            "at step 1 (default: %(default)s)", type=float, metavar="F"),
                     Option("max_grad_norm", "judge grad_norm_exceeded: the gradient norm before clipping above N "
                            "(default: not judged)", type=float, metavar="N"),
                     Option("update_ratio", "judge update_too_small/update_too_large: ||update|| / ||parameters|| "
                            "per parameter group outside [LOW, HIGH]; 'default' is 1e-5,0.1 (default: not judged)",
                            type=_update_band, metavar="LOW,HIGH|default"),
                     Option("lr_schedule", "judge lr_mismatch: the learning rate of each optimizer step against these "
                            "rates (one per step), or a function of the step's index from 0 (default: not judged)",
                            type=None, metavar="LR,LR,...|module:function", loads=_lr_schedule),
                     Option("max_skipped_steps", "judge skipped_updates: more than N optimizer steps skipped by the "
                            "GradScaler (default: not judged)", metavar="N"),
                     Option("max_loss_growth", "judge loss_diverged: a loss above G times its start (at least 0.01), "
                            "e.g. 100 (default: not judged)", type=float, metavar="G")),
                 tolerance=False),
    CheckCommand("resume-script", "resume equivalence of an unmodified training script, run as real processes",
                 "check_resume_script", (
                     Option("command", "the command that trains from scratch, split like a shell; {workdir} is a "
                            "fresh directory per run chain (the interrupted and the resumed run share one)",
                            type=None, flag="--run", required=True, metavar="COMMAND"),
                     Option("resume_command", "the command that continues from the checkpoint", type=None,
                            flag="--resume", required=True, metavar="COMMAND"),
                     Option("steps", "optimizer steps compared (default: %(default)s)"),
                     Option("resume_at", "the run is ended after the script's first checkpoint at or after optimizer "
                            "step K (default: %(default)s)", metavar="K"),
                     *_script_options()),
                 arguments=None, description="resume equivalence of an unmodified training script: two "
                 "uninterrupted runs, one ended by a real exit right after the script's own first checkpoint at or "
                 "after --resume-at, and --resume continuing from it"),
    RecipesOrCommands(
        CheckCommand("equivalent", "two recipes that should train the same (activation checkpointing on and off, "
                     "compiled and eager), compared step by step", "check_equivalent", (
                         *_recipe_options(ALL_ISOLATIONS, "inprocess"),
                         Option("steps", "calls of step() compared (default: %(default)s)"),
                         _precision(),
                         IGNORE_OPTION)),
        CheckCommand("equivalent", "two training commands that should train the same, compared optimizer step by "
                     "step", "check_runs_equivalent", (
                         Option("reference", "the command that trains as it should, split like a shell; {workdir} is "
                                "a fresh directory per run", type=None, metavar="COMMAND"),
                         Option("candidate", "the command that should train the same", type=None, metavar="COMMAND"),
                         Option("steps", "optimizer steps compared"),
                         *_script_options(),
                         IGNORE_OPTION),
                     arguments=None)),
    CheckCommand("coverage", "sample coverage: audit the sample IDs ranks read against a policy", "check_coverage",
                 (
                     Option("max_violations", "list at most N violations (default: 1,000,000; the notes count them "
                            "all)", metavar="N"),
                     Option("timeout", "seconds the reading of the iterables may take before the check ends in ERROR "
                            "(default: no limit)", type=float, metavar="S")),
                 arguments=_coverage_arguments, shape="package.module:function", key="function", tolerance=False,
                 spec_help="package.module:function or path/to/file.py:function, optionally with literal arguments, "
                 "returning (ranks, policy) or (ranks, policy, sample_ids): the arguments of tp.check_coverage"),
    CheckCommand("worker-randomness", "worker randomness: DataLoader workers, or epochs, that draw the same random "
                 "numbers (augmentations)", "check_worker_randomness", (
                     Option("epochs", "epochs of the loader iterated (default: %(default)s)"),
                     Option("batches", "batches per epoch (default: whole epochs)", metavar="N"),
                     Option("timeout", "seconds the whole check may take before it ends in ERROR and its workers are "
                            "killed (default: no limit)", type=float, metavar="S")),
                 arguments=_loader, shape="package.module:function", key="function", tolerance=False,
                 spec_help="package.module:function or path/to/file.py:function, optionally with literal arguments, "
                 "returning the torch.utils.data.DataLoader to check (a new one: the check starts its workers)"),
)


#: commands renamed, still run under their old names (a deprecation line on stderr, once): old -> new
RENAMED_COMMANDS = {"data-parallel": "parallel"}


def command_checks() -> dict[str, list[Callable[..., Result]]]:
    """The checks each command runs: its options are the checks' keywords, with the checks' own defaults."""
    return {command.name: command.checks() for command in COMMANDS}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line, one command per entry of `COMMANDS`."""
    import torch

    parser = _Parser(prog="python -m trainparity", description=__doc__.split("\n\n")[0], epilog=EXIT_STATUS_HELP,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    version = f"trainparity {__version__} (torch {torch.__version__}, Python {platform.python_version()})"
    parser.add_argument("--version", action="version", version=version)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for command in COMMANDS:
        command.add_to(commands)
    return parser


def _renamed(argv: Sequence[str] | None) -> list[str]:
    """The command line with a renamed command's old name (the first word that is not an option) replaced by its
    new one, said once on stderr: the old name is in no help text, and runs the same."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((index for index, word in enumerate(words) if not word.startswith("-")), None)
    if command is not None and words[command] in RENAMED_COMMANDS:
        old, new = words[command], RENAMED_COMMANDS[words[command]]
        old_name, new_name = f"python -m trainparity {old}", f"python -m trainparity {new}"
        if first_use(old_name):
            print(message(old_name, new_name), file=sys.stderr)
        words[command] = new
    return words


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(_renamed(argv))
    prog = f"python -m trainparity {args.command}"
    run: CheckCommand | RecipesOrCommands = args.command_run
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
