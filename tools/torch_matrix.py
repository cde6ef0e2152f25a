"""The torch version matrix: `python tools/torch_matrix.py [VERSIONS...]`.

For each torch version (default: every version the project declares tested, `TESTED`), a virtual
environment of its own, made once under `--venvs` and reused: torch at that version, then the README's
install command (`python -m pip install -e ".[dev]"`, and the test-only extras with torch pinned in the
same command, as the README says), which must leave torch as it was; then the README's test command
(`python -m pytest`), `mypy --strict trainparity`, the quickstarts and `tools/validate.py`. Prints one row
per version and exits 1 if any step of any version fails (2 for a usage error).

    python tools/torch_matrix.py                          # every tested version
    python tools/torch_matrix.py 2.15.0 --steps suite --pytest-args="-n 2"
    python tools/torch_matrix.py 2.15.0 --steps suite --pytest-args="-n 2 -m torch_internals"  # as CI does

The tests marked `torch_internals` (pyproject.toml) are those whose subject reads torch where torch changes
between versions; the others (the process engine, the command line, the pytest plugin, docs and layout) test
nothing another torch could change, and CI runs them once, on the main environment's torch.

pip's configuration on the project's machines caps torch at the versions on their disk and adds
constraints; a version that configuration cannot install is installed with it lifted
(`PIP_CONFIG_FILE=/dev/null`, which reaches the package registry) for that environment's commands only.
The machine's configuration is never edited. Each step's output goes to `<venv>/logs/<step>.log`; a failing
step's last lines are printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: the torch versions the project is tested on (README, docs/limitations.md); the first is the floor
TESTED = ("2.7.1", "2.13.0", "2.14.1", "2.15.0")
STEPS = ("suite", "mypy", "quickstarts", "validate")
QUICKSTARTS = sorted(p.stem for p in (ROOT / "trainparity" / "quickstarts").glob("[a-z]*.py"))
DEFAULT_VENVS = pathlib.Path(os.environ.get("TRAINPARITY_MATRIX_DIR",
                                            pathlib.Path.home() / ".cache" / "trainparity-matrix"))
#: a file in a venv saying which pip configuration its commands use: "machine" or "lifted"
PIP_CONFIG_MARK = "trainparity-pip-config"


@dataclasses.dataclass
class Row:
    version: str
    torch: str = "-"
    install: str = "-"
    suite: str = "-"
    mypy: str = "-"
    quickstarts: str = "-"
    validate: str = "-"
    seconds: float = 0.0
    failures: list[str] = dataclasses.field(default_factory=list)

    def cells(self) -> list[str]:
        return [self.version, self.torch, self.install, self.suite, self.mypy, self.quickstarts, self.validate,
                f"{self.seconds:.0f} s", "ok" if not self.failures else "FAIL: " + "; ".join(self.failures)]


HEADER = ["version", "torch", "install", "suite (passed/failed/errors/skipped)", "mypy", "quickstarts", "validate",
          "wall", "verdict"]


class Environment:
    """One version's virtual environment and the commands run in it."""

    def __init__(self, version: str, venvs: pathlib.Path, timeout: float) -> None:
        self.version, self.timeout = version, timeout
        self.path = venvs / f"torch-{version}"
        self.python = self.path / "bin" / "python"
        self.logs = self.path / "logs"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["VIRTUAL_ENV"] = str(self.path)
        env["PATH"] = f"{self.path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["MYPY_CACHE_DIR"] = str(self.path / "mypy-cache")  # stubs differ between torch versions
        mark = self.path / PIP_CONFIG_MARK
        if mark.exists() and mark.read_text().strip() == "lifted":
            env["PIP_CONFIG_FILE"] = os.devnull
        return env

    def choose_pip_config(self) -> None:
        """Use this machine's pip configuration if it can give this torch, else lift it (once per venv)."""
        mark = self.path / PIP_CONFIG_MARK
        if not mark.exists():
            dry = self.run("torch-dry-run", "-m", "pip", "install", "--dry-run", f"torch=={self.version}")
            mark.write_text("machine" if dry.returncode == 0 else "lifted")

    def run(self, step: str, *arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command of the environment's python in the repository, its output logged as `step`."""
        self.logs.mkdir(parents=True, exist_ok=True)
        command = [str(self.python), *arguments]
        log = self.logs / f"{step}.log"
        with open(log, "w") as file:
            file.write(f"$ {shlex.join(command)}\n")
            file.flush()
            try:
                done = subprocess.run(command, cwd=ROOT, env=env or self.env(), stdout=file, stderr=subprocess.STDOUT,
                                      text=True, timeout=self.timeout)
            except subprocess.TimeoutExpired:
                file.write(f"\n[torch_matrix] timed out after {self.timeout:g} s\n")
                return subprocess.CompletedProcess(command, 124)
        return done

    def torch_version(self) -> str | None:
        if not self.python.exists():
            return None
        done = subprocess.run([str(self.python), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                              text=True, env=self.env())
        return done.stdout.strip() if done.returncode == 0 else None

    def tail(self, step: str, lines: int = 30) -> str:
        text = (self.logs / f"{step}.log").read_text(errors="replace").splitlines()
        return "\n".join(f"    {line}" for line in text[-lines:])


def _matches(installed: str | None, version: str) -> bool:
    return installed is not None and installed.split("+")[0] == version


def prepare(environment: Environment, row: Row) -> bool:
    """The venv with torch at its version, then the README's install; False (with the reason) on failure."""
    start = time.perf_counter()
    if not environment.python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(environment.path)], check=True)
    environment.choose_pip_config()
    if not _matches(environment.torch_version(), environment.version):
        if environment.run("torch", "-m", "pip", "install", f"torch=={environment.version}").returncode != 0:
            row.failures.append(f"torch {environment.version} did not install ({environment.logs / 'torch.log'})")
            return False
    before = environment.torch_version()
    row.torch = before or "-"
    installs = [("install", ["-m", "pip", "install", "-e", ".[dev]"]),
                ("install-extras", ["-m", "pip", "install", "-e", ".[frameworks]", f"torch=={environment.version}"])]
    for step, arguments in installs:
        if environment.run(step, *arguments).returncode != 0:
            row.failures.append(f"{step} failed ({environment.logs / (step + '.log')})")
            return False
    after = environment.torch_version()
    row.install = f"{time.perf_counter() - start:.0f} s"
    if after != before:
        row.failures.append(f"the README's install changed torch from {before} to {after}")
        return False
    return True


def suite(environment: Environment, row: Row, pytest_args: list[str]) -> None:
    report = environment.logs / "suite.xml"
    start = time.perf_counter()
    done = environment.run("suite", "-m", "pytest", f"--junitxml={report}", *pytest_args)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if report.exists():
        for element in ElementTree.parse(report).getroot().iter("testsuite"):
            for key in counts:
                counts[key] += int(element.get(key, 0))
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    row.suite = (f"{passed}/{counts['failures']}/{counts['errors']}/{counts['skipped']} "
                 f"({time.perf_counter() - start:.0f} s)")
    if done.returncode != 0 or counts["tests"] == 0:
        row.failures.append(f"suite exit {done.returncode}")
        print(environment.tail("suite"), flush=True)


def simple_step(environment: Environment, row: Row, step: str) -> None:
    if step == "mypy":
        results = [environment.run("mypy", "-m", "mypy", "--strict", "trainparity")]
    elif step == "validate":
        results = [environment.run("validate", "tools/validate.py")]
    else:
        results = [environment.run(f"quickstart-{name}", "-m", f"trainparity.quickstarts.{name}")
                   for name in QUICKSTARTS]
    failed = [r for r in results if r.returncode != 0]
    setattr(row, step, "pass" if not failed else f"FAIL ({len(failed)}/{len(results)})")
    if failed:
        row.failures.append(f"{step} failed")
        logged = "mypy" if step == "mypy" else "validate" if step == "validate" else None
        for name in [logged] if logged else [f"quickstart-{n}" for n, r in zip(QUICKSTARTS, results, strict=True)
                                             if r.returncode != 0]:
            print(environment.tail(name), flush=True)


def table(rows: list[Row]) -> str:
    cells = [HEADER, *(row.cells() for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
                     for line in cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("versions", nargs="*", default=list(TESTED), metavar="VERSION",
                        help=f"torch versions, e.g. 2.15.0 (default: {' '.join(TESTED)})")
    parser.add_argument("--venvs", type=pathlib.Path, default=DEFAULT_VENVS,
                        help="where the environments live and are reused (default: $TRAINPARITY_MATRIX_DIR or "
                             "~/.cache/trainparity-matrix)")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help=f"comma-separated steps after the install (default: {','.join(STEPS)})")
    parser.add_argument("--pytest-args", default="-q", help="arguments after `python -m pytest` (default: -q)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds each command may take")
    args = parser.parse_args()
    steps = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}; choose from {list(STEPS)}")
    rows = []
    for version in args.versions:
        environment = Environment(version, args.venvs.expanduser(), args.timeout)
        row = Row(version)
        start = time.perf_counter()
        print(f"--- torch {version} in {environment.path}", flush=True)
        if prepare(environment, row):
            for step in steps:
                print(f"    {step}", flush=True)
                if step == "suite":
                    suite(environment, row, shlex.split(args.pytest_args))
                else:
                    simple_step(environment, row, step)
        row.seconds = time.perf_counter() - start
        rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    return 1 if any(row.failures for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
