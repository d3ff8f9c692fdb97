"""What the benchmarks share: their command lines (``ARGS -- HYDRA OVERRIDES``) and a stored
trial's wall time."""

from __future__ import annotations

import sys
from typing import Any


def split_overrides(argv: list[str] | None = None) -> tuple[list[str], list[str]]:
    """``argv`` (default ``sys.argv[1:]``) as the benchmark's own arguments and, after a ``--``,
    the tuner's Hydra overrides."""
    args = sys.argv[1:] if argv is None else argv
    if "--" not in args:
        return list(args), []
    i = args.index("--")
    return args[:i], args[i + 1 :]


def wall_s(t: Any) -> float | None:
    """A stored Optuna trial's wall seconds, start to complete (launch, replays, stop); None
    while it has not completed."""
    if t.datetime_start and t.datetime_complete:
        return float((t.datetime_complete - t.datetime_start).total_seconds())
    return None
