"""The trial folder: where a trial's files go and how they are written, secrets masked.

``<run dir>/trial_NNNN/`` (``confirm/trial_NNNN/round_R/seed_S/`` for the confirm stage) holds
``server.log`` (and ``server-attemptN.log`` for a launch retried after a port clash),
``requests.jsonl`` (one :class:`tuner.records.RequestRecord` a line), ``metrics.jsonl`` (the
server's ``/metrics`` samples), ``gpu.jsonl`` (NVML samples) and ``result.json`` (the
:class:`tuner.records.TrialResult`); with ``study.repeats`` each further replay has a
``repeat_K/`` folder and the trial folder a ``repeats.json``; with ``objective=capacity`` each
step of the capacity search a ``capacity_K/`` folder and the trial folder a ``capacity.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.engine.argv import mask
from tuner.records import RequestRecord, TrialResult, to_json

__all__ = [
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
    with (tdir / "requests.jsonl").open("w") as f:
        for r in records:
            f.write(to_json(r) + "\n")


def write_artifacts(tdir: Path, result: TrialResult, records: list[RequestRecord] | None) -> None:
    """``result.json``, and ``requests.jsonl`` unless ``records`` is None (written before)."""
    make_dir(tdir)
    if records is not None:
        write_requests(tdir, records)
    (tdir / "result.json").write_text(to_json(result, indent=2) + "\n")


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_repeats(tdir: Path, results: Sequence[TrialResult], mean: TrialResult) -> None:
    """A trial of several replays: each one's metrics in ``repeats.json``, their mean as the
    trial's ``result.json``."""
    (tdir / "repeats.json").write_text(
        json.dumps([{"repeat": i + 1, **r.metrics} for i, r in enumerate(results)], indent=2) + "\n"
    )
    (tdir / "result.json").write_text(to_json(mean, indent=2) + "\n")


def keep_attempt_log(tdir: Path, attempt: int) -> None:
    """The log of a launch that is retried, kept beside the next one's ``server.log``."""
    (tdir / "server.log").replace(tdir / f"server-attempt{attempt}.log")


def mask_server_logs(tdir: Path, secrets: list[str]) -> None:
    """``server.log`` and the ``server-attemptN.log`` of ``tdir`` with ``secrets`` masked."""
    if not secrets:
        return
    for path in (tdir / "server.log", *sorted(tdir.glob("server-attempt*.log"))):
        mask_file(path, secrets)


def mask_file(path: Path, secrets: list[str]) -> None:
    """``path`` rewritten with ``secrets`` and the password of any URL masked, if it has any."""
    if not path.is_file():
        return
    text = path.read_text(errors="replace")
    masked = mask(text, secrets)
    if masked != text:
        path.write_text(masked)
