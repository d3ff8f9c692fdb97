"""A SQLite study carried from one machine to the next (a GPU machine taken back mid-trial): the
trial RUNNING in the copied file belongs to a tuner on a host that is gone. The next run marks it
interrupted, so a grid runs that cell again and the trial's state is true."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from tuner.recovery import _dead, _pid_alive, recover
from tuner.stored_trial import failure_reason, mark_worker

DISTS = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}


def _study_with_running(tmp_path: Path, host: str) -> optuna.Study:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}")
    mark_worker(study.ask(DISTS), f"{host}:99999999")
    return study


def test_a_trial_running_on_another_host_of_a_moved_sqlite_study_is_interrupted(
    tmp_path: Path,
) -> None:
    study = _study_with_running(tmp_path, "gpu-machine-gone")
    out = recover(study, tmp_path / "leases", [], moved=True)
    (t,) = study.trials
    assert t.state == optuna.trial.TrialState.FAIL
    assert failure_reason(t) == "interrupted"
    assert "gpu-machine-gone" in t.user_attrs["failure_detail"]
    assert [i.number for i in out.interrupted] == [0]
    assert out.notes and "marked failed" in out.notes[0]


def test_a_shared_store_leaves_another_hosts_trial_to_it(tmp_path: Path) -> None:
    """PostgreSQL (not moved): the other host's tuner may be running it."""
    study = _study_with_running(tmp_path, "another-host")
    out = recover(study, tmp_path / "leases", [], moved=False)
    assert study.trials[0].state == optuna.trial.TrialState.RUNNING
    assert not out.interrupted


def test_this_hosts_dead_tuner_is_told_apart_from_a_move(tmp_path: Path) -> None:
    """A trial of this host's tuner is judged by its process, as before (here a pid that is no
    tuner: dead), not as a moved file's."""
    study = _study_with_running(tmp_path, socket.gethostname())
    recover(study, tmp_path / "leases", [], moved=True)
    assert (
        "no longer runs and left no server lease here"
        in study.trials[0].user_attrs["failure_detail"]
    )


@pytest.fixture
def later_tuner() -> Iterator[int]:
    """The pid of a process started now whose argv names a tuner (as a new tuner's would)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "tuner"])
    time.sleep(0.2)  # the process is exec'd: its cmdline names a tuner
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_tuner_started_after_the_trial_under_its_pid_is_not_its_tuner(
    tmp_path: Path, later_tuner: int
) -> None:
    """Every GPU machine lent here is called ``vm``: a study carried to the next one found a
    tuner alive under the stored pid, its own new one. A tuner started after the trial began
    cannot be the one that ran it, so the trial is marked interrupted; a tuner that started
    before it still counts as running it."""
    assert _pid_alive(later_tuner)
    assert _pid_alive(later_tuner, before=time.time() + 5)
    assert not _pid_alive(later_tuner, before=time.time() - 60)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}")
    mark_worker(study.ask(DISTS), f"{socket.gethostname()}:{later_tuner}")
    recover(study, tmp_path / "leases", [], moved=True)
    assert study.trials[0].state == optuna.trial.TrialState.RUNNING  # its tuner may run it
    with sqlite3.connect(tmp_path / "o.db") as db:  # the trial began a minute before it
        db.execute("UPDATE trials SET datetime_start = datetime(datetime_start, '-60 seconds')")
    recover(study, tmp_path / "leases", [], moved=True)
    (t,) = study.trials
    assert t.state == optuna.trial.TrialState.FAIL
    assert failure_reason(t) == "interrupted"


def test_an_mlflow_run_older_than_the_tuner_under_its_pid_is_a_dead_tuners(
    later_tuner: int,
) -> None:
    """MLflow's side (``close_open_runs``' judge): a RUNNING run tagged with this host and a pid
    whose tuner started after the run, this very process included, was left by a dead tuner."""
    me = f"{socket.gethostname()}:{os.getpid()}"
    assert _dead(me) is None and _dead(me, time.time()) is None  # a run this tuner opened
    why = _dead(me, time.time() - 86_400)  # a day before this process started
    assert why is not None and "no longer runs" in why
    other = f"{socket.gethostname()}:{later_tuner}"
    assert _dead(other, time.time() + 5) is None  # it may be that run's tuner
    assert _dead(other, time.time() - 60) is not None
