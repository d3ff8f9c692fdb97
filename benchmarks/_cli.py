"""What the benchmarks share: their command lines (``ARGS -- HYDRA OVERRIDES``), running the
tuner in a folder, and a stored trial's wall time."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def split_overrides(argv: list[str] | None = None) -> tuple[list[str], list[str]]:
    """``argv`` (default ``sys.argv[1:]``) as the benchmark's own arguments and, after a ``--``,
    the tuner's Hydra overrides."""
    args = sys.argv[1:] if argv is None else argv
    if "--" not in args:
        return list(args), []
    i = args.index("--")
    return args[:i], args[i + 1 :]


def listed(
    ap: argparse.ArgumentParser, value: str, allowed: tuple[str, ...], what: str
) -> list[str]:
    """A comma-separated option's items, each one of ``allowed`` (else ``ap`` exits with one
    line naming the unknown ones)."""
    items = value.split(",")
    if bad := [x for x in items if x not in allowed]:
        ap.error(f"unknown {what}: {', '.join(bad)}")
    return items


def missing_folders(paths: Sequence[Path]) -> bool:
    """Whether any of ``paths`` (run folders) is no folder; if so, one line on stderr names
    them."""
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        print(f"not a folder: {', '.join(missing)}", file=sys.stderr)
    return bool(missing)


def wall_s(t: Any) -> float | None:
    """A stored Optuna trial's wall seconds, start to complete (launch, replays, stop); None
    while it has not completed."""
    if t.datetime_start and t.datetime_complete:
        return float((t.datetime_complete - t.datetime_start).total_seconds())
    return None


ROOT = Path(__file__).resolve().parents[1]


def run_tuner(
    argv: list[str], cwd: Path, timeout_s: float, code: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m tuner ARGV`` in ``cwd`` with this checkout on ``PYTHONPATH``, in its own
    session (a time limit stops its whole group), its output captured; with ``code``,
    ``python -c CODE ARGV`` instead (a benchmark's patched tuner)."""
    return subprocess.run(
        [sys.executable, *(["-m", "tuner"] if code is None else ["-c", code]), *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
