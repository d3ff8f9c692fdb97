"""``python -m tuner.sim serve MODEL_DIR [flags]``: parse the flags (:mod:`.cli`), then serve
(:mod:`.server`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from tuner.sim.cli import parse_args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from tuner.sim.server import serve  # after the flags parse: a refused flag exits sooner

    return serve(args, os.environ)


if __name__ == "__main__":
    raise SystemExit(main())
