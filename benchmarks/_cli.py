"""What the benchmarks' command lines share: ``ARGS -- HYDRA OVERRIDES``."""

from __future__ import annotations

import sys


def split_overrides(argv: list[str] | None = None) -> tuple[list[str], list[str]]:
    """``argv`` (default ``sys.argv[1:]``) as the benchmark's own arguments and, after a ``--``,
    the tuner's Hydra overrides."""
    args = sys.argv[1:] if argv is None else argv
    if "--" not in args:
        return list(args), []
    i = args.index("--")
    return args[:i], args[i + 1 :]
