"""SIGTERM inside the event loop stops every task in turn (tuner.aio.sigterm_cancels).

The tuner's SIGTERM handler raised KeyboardInterrupt wherever the main thread was. Inside the
event loop that is whichever task runs: in a fresh-clone CI run (2026-12-03) a replay worker's.
Every task awaiting it raised it again when asyncio.Runner cancelled them all on the way out,
which ended that clean-up at the first one: the trial's task never marked the trial interrupted
and it stayed RUNNING (tests/integration/test_study.py's interrupt test, 1 run in ~10)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from types import FrameType

import pytest

from tuner.aio import sigterm_cancels


def _raise(signum: int, frame: FrameType | None) -> None:  # the tuner's own handler
    raise KeyboardInterrupt(f"signal {signum}")


async def _busy_workers(cleaned: list[str], started: threading.Event) -> None:
    """A trial's task: a replay whose workers keep the main thread busy in Python (so the
    signal lands in one of them), and the clean-up that marks the trial."""

    async def worker() -> None:
        while True:
            sum(range(20_000))  # Python bytecode: where a signal handler runs
            started.set()
            await asyncio.sleep(0)

    async def replay() -> None:
        await asyncio.gather(*(worker() for _ in range(4)))

    try:
        await asyncio.gather(replay(), replay())
    finally:
        cleaned.append("trial marked")


def test_sigterm_in_a_busy_worker_still_runs_every_clean_up() -> None:
    previous = signal.signal(signal.SIGTERM, _raise)
    cleaned: list[str] = []
    started = threading.Event()

    def kill_soon() -> None:
        started.wait(10)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=kill_soon, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt), asyncio.Runner() as runner:
            runner.run(sigterm_cancels(_busy_workers(cleaned, started)))
        assert cleaned == ["trial marked"]
        assert signal.getsignal(signal.SIGTERM) is _raise  # the tuner's handler is back
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_without_sigterm_the_result_comes_back() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    with asyncio.Runner() as runner:
        assert runner.run(sigterm_cancels(answer())) == 42
