"""The trial folder: where a trial's files go and how they are written, secrets masked.

``<run dir>/trial_NNNN/`` (``confirm/trial_NNNN/round_R/seed_S/`` for the confirm stage) holds
``server.log`` (and ``server-attemptN.log`` for a launch retried after a port clash),
``requests.jsonl`` (one :class:`tuner.records.RequestRecord` a line), ``metrics.jsonl`` (the
server's ``/metrics`` samples), ``gpu.jsonl`` (NVML samples) and ``result.json`` (the
:class:`tuner.records.TrialResult`); with ``study.repeats`` each further replay has a
``repeat_K/`` folder and the trial folder a ``repeats.json``; with ``objective=capacity`` each
step of the capacity search a ``capacity_K/`` folder and the trial folder a ``capacity.json``.
:class:`TrialFolder` names these files: every module that writes or reads one asks it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.engine.argv import mask
from tuner.records import RequestRecord, TrialResult, to_json

__all__ = [
    "TrialFolder",
    "keep_attempt_log",
    "make_dir",
    "mask_file",
    "mask_server_logs",
    "trial_dir",
    "write_artifacts",
    "write_jsonl",
    "write_json",
    "write_repeats",
    "write_requests",
]


@dataclass(frozen=True)
class TrialFolder:
    """The files of a trial's folder (or of one replay's folder in it), by name."""

    path: Path

    @property
    def server_log(self) -> Path:
        """The server's output (its launch, then its life)."""
        return self.path / "server.log"

    def attempt_log(self, attempt: int) -> Path:
        """The ``server.log`` of a launch lost to a port clash, kept as it was."""
        return self.path / f"server-attempt{attempt}.log"

    @property
    def attempt_logs(self) -> list[Path]:
        return sorted(self.path.glob("server-attempt*.log"))

    @property
    def requests(self) -> Path:
        """One :class:`tuner.records.RequestRecord` a line."""
        return self.path / "requests.jsonl"

    @property
    def metrics(self) -> Path:
        """The server's ``/metrics`` samples during the replay."""
        return self.path / "metrics.jsonl"

    @property
    def gpu(self) -> Path:
        """The NVML samples during the replay."""
        return self.path / "gpu.jsonl"

    @property
    def capacity(self) -> Path:
        """The capacity search's answer and steps (``objective=capacity``)."""
        return self.path / "capacity.json"

    @property
    def quality(self) -> Path:
        """The eval set's replay on this server (``mode=screen`` on real weights:
        :func:`tuner.quality_guard.screen_hook`; read with :func:`tuner.quality.load`)."""
        return self.path / "quality.json"

    @property
    def repeats(self) -> Path:
        """Each repeat's metrics (``study.repeats``)."""
        return self.path / "repeats.json"

    @property
    def result(self) -> Path:
        """The :class:`tuner.records.TrialResult`."""
        return self.path / "result.json"

    def replay(self, subdir: str) -> TrialFolder:
        """The folder of one replay: ``repeat_K``, ``capacity_K`` or ``""`` (the first: here)."""
        return TrialFolder(self.path / subdir)


def trial_dir(run_dir: Path, number: int) -> Path:
    return run_dir / f"trial_{number:04d}"


def make_dir(path: Path) -> Path:
    """Create a trial's (or a replay's) folder, and its parents, if missing."""
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def write_requests(tdir: Path, records: Sequence[RequestRecord]) -> None:
    """``requests.jsonl``: one request record a line."""
    make_dir(tdir)
    with TrialFolder(tdir).requests.open("w") as f:
        for r in records:
            f.write(to_json(r) + "\n")


def write_artifacts(tdir: Path, result: TrialResult, records: list[RequestRecord] | None) -> None:
    """``result.json``, and ``requests.jsonl`` unless ``records`` is None (written before)."""
    make_dir(tdir)
    if records is not None:
        write_requests(tdir, records)
    TrialFolder(tdir).result.write_text(to_json(result, indent=2) + "\n")


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_repeats(tdir: Path, results: Sequence[TrialResult], mean: TrialResult) -> None:
    """A trial of several replays: each one's metrics in ``repeats.json``, their mean as the
    trial's ``result.json``."""
    folder = TrialFolder(tdir)
    folder.repeats.write_text(
        json.dumps([{"repeat": i + 1, **r.metrics} for i, r in enumerate(results)], indent=2) + "\n"
    )
    folder.result.write_text(to_json(mean, indent=2) + "\n")


def keep_attempt_log(tdir: Path, attempt: int) -> None:
    """The log of a launch that is retried, kept beside the next one's ``server.log``."""
    folder = TrialFolder(tdir)
    folder.server_log.replace(folder.attempt_log(attempt))


def mask_server_logs(tdir: Path, secrets: list[str]) -> None:
    """``server.log`` and the ``server-attemptN.log`` of ``tdir`` with ``secrets`` masked."""
    if not secrets:
        return
    folder = TrialFolder(tdir)
    for path in (folder.server_log, *folder.attempt_logs):
        mask_file(path, secrets)


def mask_file(path: Path, secrets: list[str]) -> None:
    """``path`` rewritten with ``secrets`` and the password of any URL masked, if it has any."""
    if not path.is_file():
        return
    text = path.read_text(errors="replace")
    masked = mask(text, secrets)
    if masked != text:
        path.write_text(masked)
