"""The pytest plugin, through real pytest runs of a user's project: options, header, summary, xdist, importlib."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import uuid

import pytest
import torch
from process_helpers import running

import trainparity as tp

#: a user's test module: a recipe, and tests that report what the checks ran under
USER_TESTS = '''
import json
import os
import pathlib

import torch
import trainparity as tp
from trainparity._process import _session


class Regression(tp.Recipe):
    def __init__(self, accumulation_steps=1):
        self.accumulation_steps = accumulation_steps

    def setup(self):
        model = torch.nn.Linear(2, 1).double()
        return tp.State(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), drawn=0, step=0)

    def batches(self, state):
        while True:
            state.drawn += 1
            yield torch.arange(8, dtype=torch.float64).reshape(4, 2) / state.drawn

    def step(self, state, batch):
        loss = state.model(batch).pow(2).mean()
        (loss / self.accumulation_steps).backward()
        state.step += 1
        if state.step % self.accumulation_steps == 0:
            state.optimizer.step()
            state.optimizer.zero_grad()
        return loss.detach()


def report(name, result):
    record = {"config": result.config, "defaults": [_session.defaults().timeout, _session.defaults().precision],
              "worker": os.getpid(), "servers": fork_servers()}
    pathlib.Path(os.environ["REPORTS"], f"{name}.json").write_text(json.dumps(record))


def fork_servers():
    """The fork servers this process started: its children running trainparity's server."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
            command = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"trainparity._process._forkserver" in command:
            found.append(int(entry))
    return found


def test_resume():
    report("resume", tp.assert_resume_equivalent(Regression, steps=3))


def test_resume_in_a_fresh_interpreter():
    report("spawn", tp.assert_resume_equivalent(Regression, steps=2, isolation="spawn"))


def test_accumulation():
    tolerance = tp.ToleranceComparison(rtol=1e-6, atol=1e-9)  # also under --trainparity-precision=native
    report("accumulation", tp.assert_accumulation_equivalent(Regression, microbatches=2, isolation="process",
                                                             comparison=tolerance))


def test_coverage_fails():
    tp.assert_coverage({0: [[0]], 1: [[0]]}, policy=tp.ExactlyOnce(range(2)))
'''


def run_pytest(project: pathlib.Path, *args: str, cwd: pathlib.Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    reports = project / "reports"
    reports.mkdir(exist_ok=True)
    environment = {**os.environ, "REPORTS": str(reports), "COLUMNS": "200", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd or project,
                          env=environment, capture_output=True, text=True, timeout=400)


def reports(project: pathlib.Path) -> dict[str, dict[str, object]]:
    return {path.stem: json.loads(path.read_text()) for path in (project / "reports").glob("*.json")}


@pytest.fixture
def project(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_user.py").write_text(USER_TESTS)
    return tmp_path


@pytest.mark.numeric
def test_header_options_and_summary(project: pathlib.Path) -> None:
    # inprocess rather than spawn: test_resume_in_a_fresh_interpreter already starts fresh interpreters
    done = run_pytest(project, "tests", "--trainparity-isolation=inprocess", "--trainparity-timeout=90",
                      "--trainparity-precision=native")
    assert done.returncode == 1, done.stdout + done.stderr  # test_coverage_fails
    header = (f"trainparity {tp.__version__} (torch {torch.__version__}, Python {sys.version.split()[0]}); "
              "check defaults: isolation=inprocess, timeout=90s, precision=native")
    assert header in done.stdout.splitlines(), done.stdout
    found = reports(project)
    assert found["resume"]["config"]["isolation"] == "inprocess"  # type: ignore[index]
    assert found["spawn"]["config"]["isolation"] == "spawn"  # type: ignore[index]  # the argument wins
    assert found["accumulation"]["config"]["isolation"] == "process"  # type: ignore[index]  # the argument wins
    assert found["accumulation"]["config"]["precision"] == "native"  # type: ignore[index]
    assert found["resume"]["defaults"] == [90.0, "native"]
    summary = done.stdout.split("- trainparity -", 1)[1].split("short test summary", 1)[0]
    assert summary.splitlines()[1:5] == [
        "4 checks: 3 PASS, 1 FAIL",
        "  accumulation: 1 PASS",
        "  coverage: 1 FAIL",
        "  resume: 2 PASS",
    ], done.stdout


@pytest.mark.exact
@pytest.mark.parametrize(("option", "message"), [
    ("--trainparity-timeout=0",
     "--trainparity-timeout: timeout= must be a positive number of seconds, at most 100000000 (about three years), "
     "got 0.0"),
    ("--trainparity-isolation=thread", "argument --trainparity-isolation: invalid choice: 'thread'"),
])
def test_bad_options_are_usage_errors(project: pathlib.Path, option: str, message: str) -> None:
    done = run_pytest(project, "tests", option)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert message in done.stderr


@pytest.mark.exact
def test_the_plugin_can_be_turned_off(project: pathlib.Path) -> None:
    done = run_pytest(project, "tests", "-p", "no:trainparity", "-k", "test_coverage_fails")
    assert done.returncode == 1
    assert "- trainparity -" not in done.stdout and "check defaults" not in done.stdout


@pytest.mark.numeric
def test_xdist_one_fork_server_per_worker_and_nothing_left_running(project: pathlib.Path) -> None:
    marker = f"trainparity-test-{uuid.uuid4()}"
    done = run_pytest(project, "tests", "-n", "2", "-p", "xdist", env={"TRAINPARITY_PLUGIN_TEST": marker})
    assert done.returncode == 1, done.stdout + done.stderr
    # the controller sums the workers' counts
    assert "4 checks: 3 PASS, 1 FAIL" in done.stdout, done.stdout
    found = reports(project)
    servers = {record["worker"]: record["servers"] for name, record in found.items() if name != "spawn"}
    assert all(len(pids) == 1 for pids in servers.values()), servers  # type: ignore[arg-type]
    every_server = [pid for pids in servers.values() for pid in pids]  # type: ignore[attr-defined]
    assert len(set(every_server)) == len(servers), servers  # one per worker, none shared
    assert not any(running(pid) for pid in every_server)
    assert _processes_carrying(marker) == []


def _processes_carrying(marker: str, grace: float = 5.0) -> list[int]:
    """Processes whose environment holds the marker: everything the run started, at any depth."""
    deadline = time.monotonic() + grace
    while True:
        found = []
        for entry in os.listdir("/proc"):
            try:
                environment = pathlib.Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if marker.encode() in environment and running(int(entry)):
                found.append(int(entry))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.mark.numeric
def test_built_in_defaults_and_import_mode_importlib_with_a_module_the_children_cannot_import_by_name(
        project: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Without a trainparity option the checks run under the built-in defaults: one run of pytest within pytest
    (seconds) shows those and the importlib import mode, as both take the same passing checks."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # neither the project nor its tests directory is on sys.path
    done = run_pytest(project, str(project / "tests"), "--import-mode=importlib", "--rootdir", str(project),
                      "-k", "not test_coverage_fails", cwd=elsewhere)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "check defaults: isolation=per check, timeout=120s, precision=float64" in done.stdout
    found = reports(project)
    assert found["resume"]["config"]["recipe"] == "tests.test_user:Regression"  # type: ignore[index]
    assert {"resume", "spawn", "accumulation"} <= set(found)
    assert found["resume"]["config"]["isolation"] == "process"  # type: ignore[index]
    assert found["accumulation"]["config"]["precision"] == "float64"  # type: ignore[index]


WORKER_TESTS = '''
import numpy as np
from torch.utils.data import DataLoader, Dataset

import trainparity as tp


class Shared(Dataset):
    def __init__(self):
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return index + self.rng.random()


def test_workers_draw_their_own_numbers():
    tp.assert_worker_randomness(DataLoader(Shared(), batch_size=2, num_workers=2), epochs=1)
'''


@pytest.mark.exact
def test_the_worker_check_is_counted_and_its_failure_names_the_stream(tmp_path: pathlib.Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_workers.py").write_text(WORKER_TESTS)
    done = run_pytest(tmp_path, "tests", "-rf")
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("FAILED tests/test_workers.py::test_workers_draw_their_own_numbers - AssertionError: trainparity "
            "worker_randomness check: FAIL at dataset.rng (worker_rng_shared, epoch 0)") in done.stdout, done.stdout
    summary = done.stdout.split("- trainparity -", 1)[1].split("short test summary", 1)[0]
    assert summary.splitlines()[1:3] == ["1 check: 1 FAIL", "  worker_randomness: 1 FAIL"], done.stdout
