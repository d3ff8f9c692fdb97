"""Loading a script of ``benchmarks/`` as a module, for the tests of its pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark(name: str) -> Any:
    """``benchmarks/<name>.py`` as a module, with ``benchmarks/`` on ``sys.path`` while it loads
    (its ``from _cli import ...`` and siblings), registered in ``sys.modules`` under ``name``
    (its dataclasses look their module up)."""
    folder = str(ROOT / "benchmarks")
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(folder)
    return mod
