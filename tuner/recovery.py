"""Crash safety: what a tuner killed with ``kill -9`` left behind is found and cleaned up by the
next run of the same study.

Before each launch the study writes a *lease* (``<state_dir>/leases/<id>.json``: study, trial,
host, the tuner's pid, the MLflow parent run and store (its password hidden), the trial folder)
and gives the server the environment variable
``TUNER_LEASE=<id>``. The lease is removed after teardown. A lease whose tuner is no longer alive
on this host means that tuner died: :func:`recover` SIGKILLs every process group that carries the
lease's marker (found through ``/proc/<pid>/environ``, never by name), removes the containers
(``engine=docker``) labelled with the lease (``docker rm -f``: a container's processes are root's,
not found through ``/proc`` by a tuner that is not root), masks the secrets in the
server logs of its trial folder (the dead tuner had no time to), and marks the Optuna trial
FAIL with ``failure_reason=interrupted``. RUNNING trials whose tuner died before it launched
anything (no lease) are marked FAIL too. Leases of other hosts are left to their hosts.

Then, once the new invocation's MLflow run is open, :func:`close_runs` records a FAILED child run
(``failure_reason`` ``interrupted``) for each trial :func:`recover` marked, under the dead
invocation's parent run, and ends KILLED every run of the study its dead tuner left RUNNING (its
parent run, say during the confirm stage, when no trial was running; a child run it was writing)
with the tag ``killed_reason``. Runs name their tuner by the tag ``tuner.worker``.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna

from tuner import stored_trial
from tuner.artifacts import mask_server_logs
from tuner.config import TunerConfig
from tuner.engine.container import remove_leftovers
from tuner.engine.process import group_members
from tuner.stores import hide_url
from tuner.tracking import close_open_runs, find_parent, log_interrupted

__all__ = ["LEASE_ENV", "Interrupted", "Lease", "Recovered", "close_runs", "recover", "worker_id"]

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
    """The MLflow store, its password hidden (:func:`close_runs` takes the one configured)."""
    started: float
    trial_dir: str | None = None
    """The trial's folder, whose server logs :func:`recover` masks."""
    container_program: str | None = None
    """``engine.container.program`` when the server is a container (:func:`recover` removes it
    by its label ``tuner.lease=<id>`` and by ``cidfile``); None for a process."""
    cidfile: str | None = None
    """The file ``docker run --cidfile`` writes the container's id to."""

    @classmethod
    def create(
        cls,
        directory: Path,
        study: str,
        trial: int,
        parent_run_id: str | None,
        tracking_uri: str | None,
        trial_dir: Path | None = None,
        container_program: str | None = None,
        cidfile: Path | None = None,
    ) -> Lease:
        lease = cls(
            id=uuid.uuid4().hex,
            study=study,
            trial=trial,
            host=socket.gethostname(),
            tuner_pid=os.getpid(),
            parent_run_id=parent_run_id,
            tracking_uri=hide_url(tracking_uri) if tracking_uri else None,
            started=time.time(),
            trial_dir=str(trial_dir) if trial_dir is not None else None,
            container_program=container_program,
            cidfile=str(cidfile) if cidfile is not None else None,
        )
        directory.mkdir(parents=True, exist_ok=True)
        lease.path(directory).write_text(json.dumps(asdict(lease)))
        return lease

    def path(self, directory: Path) -> Path:
        return directory / f"{self.id}.json"

    def release(self, directory: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(directory).unlink()


def _pid_alive(pid: int, before: float | None = None) -> bool:
    """Whether a tuner runs as ``pid``; with ``before`` (epoch seconds: when the dead tuner wrote
    its lease or started its trial), only one that started by then. A reused pid counts as
    dead: a process that is no tuner, or a tuner started later (every GPU machine lent here is
    called ``vm`` and its tuners get similar pids, so a study carried to the next machine once
    found its new tuner, or the ``timeout`` that runs it, under the old trial's pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"tuner" in cmdline and _started_by(pid, before)


def _started_by(pid: int, before: float | None) -> bool:
    """Whether process ``pid`` started by ``before`` (epoch seconds; True if either is unknown),
    to a second: ``/proc/stat``'s boot time is in whole seconds."""
    started = _started(pid)
    return before is None or started is None or started <= before + 1.0


def _started(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds, from ``/proc``), None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        btime = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        ticks = int(stat.rpartition(")")[2].split()[19])  # field 22, after the command's ")"
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return btime + ticks / os.sysconf("SC_CLK_TCK")


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


@dataclass(frozen=True)
class Interrupted:
    """A trial :func:`recover` marked FAIL because its tuner died."""

    number: int
    params: dict[str, Any]
    detail: str
    worker: str
    """The dead tuner, ``host:pid``."""
    parent_run_id: str | None = None
    """Its MLflow parent run and store, as its lease recorded them (none without a lease)."""
    tracking_uri: str | None = None


@dataclass
class Recovered:
    """What :func:`recover` did: a line per action, and the trials it marked FAIL."""

    notes: list[str] = field(default_factory=list)
    interrupted: list[Interrupted] = field(default_factory=list)


def _fail_trial(study: optuna.Study, number: int, detail: str) -> dict[str, Any] | None:
    """Mark a RUNNING trial FAIL (interrupted); its params, or None if it was not RUNNING."""
    trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
    if trial is None or trial.state != optuna.trial.TrialState.RUNNING:
        return None
    stored_trial.mark_interrupted(study, trial, detail)
    return dict(trial.params)


def lease_dir(cfg: TunerConfig) -> Path:
    """Where each running trial's lease file lives (crash recovery reads them)."""
    return Path(cfg.paths.state_dir) / "leases"


def recover(
    study: optuna.Study,
    lease_dir: Path,
    secrets: list[str] | None = None,
    *,
    moved: bool = False,
) -> Recovered:
    """Clean up after dead tuners of this study on this host: stop the servers (and remove the
    containers) they left, mask
    ``secrets`` in the server logs of their trial folders, mark their RUNNING trials FAIL
    (interrupted). With ``moved`` (a SQLite study: one file, that only this host's tuners
    write), a RUNNING trial of a tuner on another host is interrupted too: its file was copied
    here (a study carried from one GPU machine to the next), so nothing runs that trial.
    MLflow is :func:`close_runs`'s."""
    host = socket.gethostname()
    out = Recovered()
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
        if _pid_alive(lease.tuner_pid, before=lease.started):
            continue  # another tuner on this host is running this trial right now
        boxes: list[str] = []
        if lease.container_program:  # before the CLI's group: the container outlives it
            cidfile = Path(lease.cidfile) if lease.cidfile else None
            boxes = remove_leftovers(lease.container_program, lease.id, cidfile)
        killed = _kill_marked(lease.id)
        if lease.trial_dir and secrets:
            mask_server_logs(Path(lease.trial_dir), secrets)
        detail = f"the tuner (pid {lease.tuner_pid}) died during this trial"
        params = _fail_trial(study, lease.trial, detail)
        if params is not None:
            out.interrupted.append(
                Interrupted(
                    lease.trial,
                    params,
                    detail,
                    f"{lease.host}:{lease.tuner_pid}",
                    lease.parent_run_id,
                    lease.tracking_uri,
                )
            )
        lease.release(lease_dir)
        what = "marked the trial failed (interrupted)" if params is not None else "its trial ended"
        removed = f", removed container(s) {', '.join(b[:12] for b in boxes)}" if boxes else ""
        out.notes.append(
            f"trial {lease.trial}: its tuner died; stopped {killed} server process group(s) it "
            f"left{removed}, {what}"
        )
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = stored_trial.worker(t)
        w_host, _, w_pid = worker.rpartition(":")
        if t.number in leased:
            continue
        if moved and w_host and w_host != host:
            detail = f"its tuner ran on host {w_host}; this SQLite study was copied here since"
            note = detail
        elif w_host == host and w_pid.isdigit() and not _pid_alive(int(w_pid), _began(t)):
            # no lease here: it died before launching, or the study was copied from another
            # machine under the same host name (every lent GPU machine is called `vm`)
            detail = f"the tuner (pid {w_pid}) no longer runs and left no server lease here"
            note = "its tuner no longer runs (no server lease here)"
        else:
            continue
        params = _fail_trial(study, t.number, detail)
        if params is not None:
            out.interrupted.append(Interrupted(t.number, params, detail, worker))
        out.notes.append(f"trial {t.number}: {note}; marked failed")
    return out


def _began(t: optuna.trial.FrozenTrial) -> float | None:
    """When trial ``t`` started (epoch seconds; Optuna stores the local time), None if unknown."""
    return t.datetime_start.timestamp() if t.datetime_start is not None else None


def _dead(worker: str, started: float | None = None) -> str | None:
    """Why tuner ``worker`` (``host:pid``) of a run ``started`` then (epoch seconds) counts as
    dead, or None while it may live (another host's is left to that host). A tuner under that
    pid started after the run, this one included, is not the run's (:func:`_pid_alive`)."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    if int(pid) == os.getpid():  # this tuner (whose argv need not name it: a run in-process)
        if _started_by(os.getpid(), started):
            return None
    elif _pid_alive(int(pid), started):
        return None
    return f"its tuner ({worker}) no longer runs; closed by the next run ({worker_id()})"


def close_runs(
    recovered: Recovered, study: str, tracking_uri: str | None, experiment: str
) -> list[str]:
    """MLflow's side of :func:`recover`: a FAILED child run per trial it marked (under the dead
    invocation's parent run: its lease's, else the run tagged with the dead tuner), then every
    run of ``study`` a dead tuner left RUNNING ended KILLED with the tag ``killed_reason``, in
    ``tracking_uri`` (None: tracking off) and in a lease's store if that is another. Returns a
    line per run closed; a failing store is logged, never raised."""
    stores = {tracking_uri} if tracking_uri else set()
    for it in recovered.interrupted:
        uri, parent = it.tracking_uri, it.parent_run_id
        if uri and tracking_uri and uri == hide_url(tracking_uri):
            uri = tracking_uri  # the lease keeps the store's URL without its password
        try:
            if not (uri and parent) and tracking_uri:
                uri, parent = tracking_uri, find_parent(tracking_uri, experiment, it.worker)
            if uri and parent:
                stores.add(uri)
                log_interrupted(uri, parent, it.number, it.params, it.detail)
        except Exception as exc:  # tracking must not stop the recovery
            log.warning("could not record interrupted trial %d in MLflow: %s", it.number, exc)
    done: list[str] = []
    for uri in sorted(stores):
        try:
            done += close_open_runs(uri, experiment, study, _dead)
        except Exception as exc:
            log.warning("could not close the MLflow runs dead tuners left in %s: %s", uri, exc)
    return done
