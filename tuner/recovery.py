"""Crash safety: what a tuner killed with ``kill -9`` left behind is found and cleaned up by the
next run of the same study.

Before each launch the study writes a *lease* (``<state_dir>/leases/<id>.json``: study, trial,
host, the tuner's pid, the MLflow parent run) and gives the server the environment variable
``TUNER_LEASE=<id>``. The lease is removed after teardown. A lease whose tuner is no longer alive
on this host means that tuner died: :func:`recover` SIGKILLs every process group that carries the
lease's marker (found through ``/proc/<pid>/environ``, never by name), marks the Optuna trial FAIL
with ``failure_reason=interrupted``, records a FAILED MLflow child run under the dead
invocation's parent run and marks that parent FAILED. RUNNING trials whose tuner died before it
launched anything (no lease) are marked FAIL too. Leases of other hosts are left to their hosts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna

from tuner import stored_trial
from tuner.engine.process import group_members

__all__ = ["LEASE_ENV", "Lease", "recover", "worker_id"]

log = logging.getLogger(__name__)

LEASE_ENV = "TUNER_LEASE"


def worker_id() -> str:
    """``host:pid`` of this tuner process (stored on every trial it runs)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Lease:
    id: str
    study: str
    trial: int
    host: str
    tuner_pid: int
    parent_run_id: str | None
    tracking_uri: str | None
    started: float

    @classmethod
    def create(
        cls,
        directory: Path,
        study: str,
        trial: int,
        parent_run_id: str | None,
        tracking_uri: str | None,
    ) -> Lease:
        lease = cls(
            id=uuid.uuid4().hex,
            study=study,
            trial=trial,
            host=socket.gethostname(),
            tuner_pid=os.getpid(),
            parent_run_id=parent_run_id,
            tracking_uri=tracking_uri,
            started=time.time(),
        )
        directory.mkdir(parents=True, exist_ok=True)
        lease.path(directory).write_text(json.dumps(asdict(lease)))
        return lease

    def path(self, directory: Path) -> Path:
        return directory / f"{self.id}.json"

    def release(self, directory: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(directory).unlink()


def _pid_alive(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"tuner" in cmdline  # a reused pid that is not a tuner counts as dead


def _marked_groups(lease_id: str) -> set[int]:
    needle = f"{LEASE_ENV}={lease_id}".encode()
    groups: set[int] = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if needle in (d / "environ").read_bytes():
                stat = (d / "stat").read_text()
                groups.add(int(stat[stat.rfind(")") + 2 :].split()[2]))
        except (OSError, ValueError, IndexError):
            continue
    return groups


def _kill_marked(lease_id: str) -> int:
    """SIGKILL the process groups carrying the lease's marker; returns how many."""
    groups = _marked_groups(lease_id)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(group_members(g) for g in groups):
        time.sleep(0.1)
    return len(groups)


def _fail_trial(study: optuna.Study, number: int, detail: str) -> dict[str, Any] | None:
    """Mark a RUNNING trial FAIL (interrupted); its params, or None if it was not RUNNING."""
    trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
    if trial is None or trial.state != optuna.trial.TrialState.RUNNING:
        return None
    storage = study._storage  # noqa: SLF001 - Optuna has no public API for a RUNNING trial's attrs
    storage.set_trial_user_attr(trial._trial_id, "failure_reason", "interrupted")  # noqa: SLF001
    storage.set_trial_user_attr(trial._trial_id, "failure_detail", detail)  # noqa: SLF001
    study.tell(number, state=optuna.trial.TrialState.FAIL)
    return dict(trial.params)


def _record_mlflow(lease: Lease, params: dict[str, Any], detail: str) -> None:
    if not lease.parent_run_id or not lease.tracking_uri:
        return
    from mlflow import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    client = MlflowClient(tracking_uri=lease.tracking_uri)
    parent = client.get_run(lease.parent_run_id)
    tags = {
        MLFLOW_PARENT_RUN_ID: lease.parent_run_id,
        "tuner.role": "trial",
        "trial.number": str(lease.trial),
        "trial.state": "failed",
        "failure_reason": "interrupted",
        "failure_detail": detail,
        **{k: v for k, v in parent.data.tags.items() if k in ("engine", "model", "workload")},
    }
    run = client.create_run(
        parent.info.experiment_id, run_name=f"trial-{lease.trial:04d}", tags=tags
    )
    for k, v in params.items():
        client.log_param(run.info.run_id, k, str(v))
    client.set_terminated(run.info.run_id, "FAILED")
    if parent.info.status == "RUNNING":
        client.set_terminated(lease.parent_run_id, "FAILED")


def recover(study: optuna.Study, lease_dir: Path) -> list[str]:
    """Clean up after dead tuners of this study on this host; returns what was done."""
    host = socket.gethostname()
    done: list[str] = []
    leased: set[int] = set()
    for path in sorted(lease_dir.glob("*.json")) if lease_dir.is_dir() else []:
        try:
            lease = Lease(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            log.warning("ignoring unreadable lease %s", path)
            continue
        if lease.study != study.study_name or lease.host != host:
            continue
        leased.add(lease.trial)
        if _pid_alive(lease.tuner_pid):
            continue  # another tuner on this host is running this trial right now
        killed = _kill_marked(lease.id)
        detail = f"the tuner (pid {lease.tuner_pid}) died during this trial"
        params = _fail_trial(study, lease.trial, detail)
        if params is not None:
            try:
                _record_mlflow(lease, params, detail)
            except Exception as exc:  # tracking must not stop the recovery
                log.warning("could not record interrupted trial %d in MLflow: %s", lease.trial, exc)
        lease.release(lease_dir)
        done.append(
            f"trial {lease.trial}: its tuner died; stopped {killed} server process group(s) it "
            "left, marked the trial failed (interrupted)"
        )
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = stored_trial.worker(t)
        w_host, _, w_pid = worker.rpartition(":")
        if t.number in leased or w_host != host or not w_pid.isdigit():
            continue
        if not _pid_alive(int(w_pid)):
            _fail_trial(study, t.number, f"the tuner (pid {w_pid}) died before launching")
            done.append(f"trial {t.number}: its tuner died before launching; marked failed")
    return done
