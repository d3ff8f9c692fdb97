"""Finding the processes a test's tuner started, by a marker in their environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def marked_pids(marker: str) -> list[int]:
    """Live processes whose environment contains ``marker`` (a unique string the test set)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "environ").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def sim_argv(model: str, port: int, *flags: str) -> list[str]:
    """``python -m tuner.sim serve MODEL`` on loopback, as the launcher would start it."""
    return [
        sys.executable, "-m", "tuner.sim", "serve", model, "--host", "127.0.0.1",
        "--port", str(port), "--served-model-name", "m", "--load-format", "dummy", *flags,
    ]  # fmt: skip


def run_benchmark(
    name: str, *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python benchmarks/NAME.py ARGS`` in ``cwd``, its output captured as text."""
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, str(root / "benchmarks" / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )
