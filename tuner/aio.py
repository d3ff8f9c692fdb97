"""Small asyncio helpers shared by the pipeline stages."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has stopped; its cancellation is not re-raised (any
    other exception it ends with is)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def sigterm_cancels(coro: Awaitable[T]) -> T:
    """Await ``coro`` with SIGTERM cancelling this task, as :class:`asyncio.Runner` does with
    Ctrl-C, then raise :class:`KeyboardInterrupt` as the tuner's own SIGTERM handler does
    outside the loop. Raised from that handler inside the loop instead, the interrupt lands in
    whichever task runs at that moment: a replay's worker, say (a fresh-clone CI run,
    2026-12-03). Each task awaiting it then raises it again when the Runner cancels them all on
    its way out, which stops that clean-up at the first one, so the trial's own task never
    marks the trial interrupted, and it stays RUNNING. A cancellation reaches every task, each
    stops in turn, and the trial is marked. The previous handler is put back after; outside the
    main thread (no signal handlers there) ``coro`` runs as it is."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    stopped: list[int] = []

    def on_sigterm() -> None:
        stopped.append(signal.SIGTERM)
        if task is not None:
            task.cancel()

    previous = signal.getsignal(signal.SIGTERM)
    try:
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    except (RuntimeError, ValueError, NotImplementedError):  # not the main thread
        return await coro
    try:
        result = await coro
    except asyncio.CancelledError:
        if stopped:
            raise KeyboardInterrupt(f"signal {signal.SIGTERM.value}") from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    if stopped:  # the cancellation was swallowed: stop all the same
        raise KeyboardInterrupt(f"signal {signal.SIGTERM.value}")
    return result


def run(
    coro: Coroutine[Any, Any, T], loop_factory: Callable[[], asyncio.AbstractEventLoop] | None
) -> T:
    """``asyncio.run`` of ``coro`` on a loop from ``loop_factory`` (``workload.client_loop``,
    :func:`tuner.replay_client.loop_factory`), SIGTERM stopping it as Ctrl-C does
    (:func:`sigterm_cancels`: the tasks stop in turn)."""
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(sigterm_cancels(coro))
