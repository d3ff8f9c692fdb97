"""Secrets and dead services through the CLI (`python -m tuner`): each fault is one line on
stderr, no traceback, within seconds, and no password reaches the output or a file.
``tests/unit/test_stores.py`` checks the pieces; ``test_study.py`` the API key in a whole study."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.cli import main_in_process

pytestmark = pytest.mark.integration

PW = "PWsecret9"
DEAD_DB = f"postgresql+psycopg://u:{PW}@127.0.0.1:1/db"
DEAD_MLFLOW = f"http://bob:{PW}@127.0.0.1:1"


def tuner(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return p, time.monotonic() - t0


def one_line(p: subprocess.CompletedProcess[str], needle: str, code: int = 1) -> str:
    assert p.returncode == code, p.stdout[-2000:] + p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert "Traceback" not in out, out[-3000:]
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert needle in err, err
    return err


def nothing_leaked(where: Path, *secrets: str) -> int:
    """No file under ``where`` holds a secret; how many files were read."""
    files = [f for f in where.rglob("*") if f.is_file()]
    for f in files:
        data = f.read_bytes()
        for s in secrets:
            assert s.encode() not in data, f
    return len(files)


@pytest.mark.parametrize("command", [["+workload=chat"], ["report", "study.name=x"]])
def test_a_dead_database_is_one_line_within_seconds(tmp_path: Path, command: list[str]) -> None:
    p, took = tuner(tmp_path, *command, f"study.storage={DEAD_DB}", "study.n_trials=1")
    err = one_line(p, "cannot reach study.storage postgresql+psycopg://u:***@127.0.0.1:1/db")
    assert "Connection refused" in err
    assert took < 30  # 5 retries over 16 s and a 150-line traceback before
    assert PW not in p.stdout + p.stderr
    nothing_leaked(tmp_path, PW)
    assert not (tmp_path / "outputs" / "runs").exists(), "nothing of its own: no run folder"


def test_a_dead_tracking_server_is_one_line_within_seconds(tmp_path: Path) -> None:
    p, took = tuner(tmp_path, "+workload=chat", f"tracking.uri={DEAD_MLFLOW}", "study.n_trials=1")
    err = one_line(p, "cannot reach the MLflow tracking server http://bob:***@127.0.0.1:1")
    assert "tracking=none" in err
    assert took < 30  # 42 retry warnings over 25 minutes before
    assert PW not in p.stdout + p.stderr
    nothing_leaked(tmp_path, PW)
    assert not (tmp_path / "outputs" / "state" / "optuna.db").exists(), "no study created"


@pytest.mark.fast
@pytest.mark.parametrize(
    ("blocked", "args", "needle"),
    [
        ("outputs", [], "cannot create the run folder outputs/runs/"),
        ("state", ["paths.state_dir=state/sub"], "cannot create the folder of study.storage"),
    ],
)
def test_an_unwritable_folder_is_one_line(
    tmp_path: Path,
    blocked: str,
    args: list[str],
    needle: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the tests run as root, whom a read-only mode does not stop: a regular file where the
    # folder must go fails the same mkdir (NotADirectoryError / FileExistsError)
    (tmp_path / blocked).write_text("not a folder")
    t0 = time.monotonic()
    code, out, err = main_in_process(  # the CLI's main(), in this process
        tmp_path,
        "+workload=chat",
        "study.n_trials=1",
        *args,
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    took = time.monotonic() - t0
    one_line(subprocess.CompletedProcess(["tuner"], code, out, err), needle)
    assert took < 30


@pytest.mark.fast
def test_host_in_the_fixed_flags_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = main_in_process(
        tmp_path,
        "+workload=chat",
        "engine.extra_args=[--host,0.0.0.0]",
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    p = subprocess.CompletedProcess(["tuner"], code, out, err)
    one_line(p, "engine.extra_args sets --host; the tuner sets --host 127.0.0.1", code=2)


def test_passwords_in_urls_are_masked_in_hydra_files_and_logs(tmp_path: Path) -> None:
    """A run that keeps its run folder (a dry run): Hydra's copies of the command line and config
    (``.hydra/*.yaml``) and the job's log show the URLs without their passwords."""
    p, _ = tuner(
        tmp_path,
        "+workload=chat",
        "dry_run=true",
        "hydra.verbose=tuner",
        f"study.storage={DEAD_DB}",
        f"tracking.uri={DEAD_MLFLOW}",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert PW not in p.stdout + p.stderr
    hydra_files = list(tmp_path.glob("outputs/runs/*/.hydra/*.yaml"))
    assert len(hydra_files) == 3
    overrides = next(f for f in hydra_files if f.name == "overrides.yaml").read_text()
    assert "postgresql+psycopg://u:***@127.0.0.1:1/db" in overrides
    assert "http://bob:***@127.0.0.1:1" in overrides
    assert nothing_leaked(tmp_path, PW) >= 4  # .hydra/*.yaml and the job's log
