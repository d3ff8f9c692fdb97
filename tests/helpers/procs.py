"""Finding the processes a test's tuner started, by a marker in their environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest


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


def sim_server(
    log_path: Path,
    *flags: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    preload: Any = None,
) -> Any:
    """A :class:`tuner.engine.process.Server` of the simulator (the small shipped model, 20x
    speed-up) on a free loopback port, logging to ``log_path``; ``env`` on top of ours."""
    from tuner.engine.process import Server, free_port

    port = free_port()
    root = Path(__file__).resolve().parents[2]
    return Server(
        sim_argv(str(root / "models" / "qwen-0.5b-dummy"), port, *flags),
        env={**os.environ, "TUNER_SIM_SPEEDUP": "20", **(env or {})},
        log_path=log_path,
        host="127.0.0.1",
        port=port,
        startup_timeout_s=timeout,
        stop_timeout_s=5,
        health_interval_s=0.1,
        preload=preload,
    )


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


def kill_9_once_serving(cwd: Path, args: list[str], env: Mapping[str, str]) -> None:
    """``python -m tuner ARGS`` in its own session, SIGKILLed once trial 0's server logs that it
    is up (no cleanup at all: what it started lives on, as after a crash)."""

    def serving() -> bool:
        logs = list(cwd.glob("outputs/runs/*/trial_0000/server.log"))
        return bool(logs) and "Application startup complete" in logs[0].read_text()

    kill_9_when(cwd, args, env, serving, "no server came up")


def kill_9_when(
    cwd: Path,
    args: list[str],
    env: Mapping[str, str],
    ready: Callable[[], bool],
    never: str,
    timeout: float = 60,
) -> int:
    """``python -m tuner ARGS`` in its own session, SIGKILLed alone once ``ready()``; the test
    fails with ``never`` if the tuner ends or ``timeout`` passes first. Returns the tuner's pid."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", *args],
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if ready():
                break
            time.sleep(0.05)
        else:
            pytest.fail(never)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.pid
