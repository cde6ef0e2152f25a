"""`python -m trainparity`: run a check on a recipe named `package.module:ClassName`.

Exit status: 0 PASS, 1 FAIL, 2 ABSTAIN, 3 ERROR, 4 usage error or bad spec (one line on
stderr, no traceback).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from trainparity._result import Outcome, Result

EXIT_CODES = {Outcome.PASS: 0, Outcome.FAIL: 1, Outcome.ABSTAIN: 2, Outcome.ERROR: 3}
USAGE_ERROR = 4


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def _tolerance(args: argparse.Namespace) -> object:
    from trainparity._compare import ToleranceComparison

    if args.rtol is None and args.atol is None:
        return None
    return ToleranceComparison(rtol=args.rtol or 0.0, atol=args.atol or 0.0)


def _run_resume(args: argparse.Namespace) -> Result:
    from trainparity._resume import check_resume

    return check_resume(
        args.recipe,
        steps=args.steps,
        resume_at=args.resume_at,
        comparison=_tolerance(args),
        seed=args.seed,
        isolation=args.isolation,
        timeout=args.timeout,
    )


def _microbatches(text: str) -> int | tuple[int, ...]:
    """`4` (equal parts) or `3,3,2` (declared sizes)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an int or comma-separated sizes such as 3,3,2, got {text!r}"
        ) from None
    return values[0] if len(values) == 1 else values


def _run_accumulation(args: argparse.Namespace) -> Result:
    from trainparity._accumulation import check_accumulation

    return check_accumulation(
        args.recipe,
        microbatches=args.microbatches,
        cycles=args.cycles,
        comparison=_tolerance(args),
        seed=args.seed,
        precision=args.precision,
        disable_dropout=not args.keep_dropout,
        batch_dependent=args.batch_dependent,
        isolation=args.isolation,
        timeout=args.timeout,
    )


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="the recipe, as package.module:ClassName")
    parser.add_argument("--json", type=pathlib.Path, metavar="FILE", help="also write the result as JSON")
    parser.add_argument("--rtol", type=float, help="declared relative tolerance (default: exact)")
    parser.add_argument("--atol", type=float, help="declared absolute tolerance (default: exact)")
    parser.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m trainparity", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    resume = commands.add_parser("resume", help="resume equivalence across real process restarts")
    _common(resume)
    resume.add_argument("--steps", type=int, default=6)
    resume.add_argument("--resume-at", type=int, default=None)
    resume.add_argument("--isolation", choices=("process", "spawn", "inprocess"), default="process")
    resume.add_argument("--timeout", type=float, default=120.0)
    resume.set_defaults(run=_run_resume)
    accumulation = commands.add_parser("accumulation", help="k micro-batches of accumulation vs one full-batch step")
    _common(accumulation)
    accumulation.add_argument("--microbatches", type=_microbatches, default=4, metavar="K|N,N,...",
                              help="number of equal micro-batches, or their sizes (default: 4)")
    accumulation.add_argument("--cycles", type=int, default=2, help="full batches compared (default: 2)")
    accumulation.add_argument("--keep-dropout", action="store_true", help="leave dropout modules active")
    accumulation.add_argument("--precision", choices=("float64", "native"), default="float64",
                              help="run both in float64 and judge with its fixed tolerance (default), or in the "
                              "recipe's own dtypes")
    accumulation.add_argument("--batch-dependent", choices=("fail", "eval"), default="fail",
                              help="BatchNorm-like layers in training mode: FAIL on the divergence they cause "
                              "(default), or run them in eval mode to judge the loop alone")
    accumulation.add_argument("--isolation", choices=("inprocess", "process", "spawn"), default="inprocess")
    accumulation.add_argument("--timeout", type=float, default=120.0)
    accumulation.set_defaults(run=_run_accumulation)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], Result] = args.run
    try:
        result = run(args)
    except (TypeError, ValueError) as error:
        print(f"python -m trainparity {args.command}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    print(result.report())
    if args.json is not None:
        try:
            args.json.write_text(result.to_json() + "\n")
        except OSError as error:  # not exit status 1 with a traceback: 1 means FAIL
            print(f"python -m trainparity {args.command}: error: cannot write --json {args.json}: "
                  f"{error.strerror or error}; pass a path in an existing, writable directory", file=sys.stderr)
            return USAGE_ERROR
    return EXIT_CODES[result.outcome]
