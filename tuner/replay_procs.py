"""The replay spread over several client processes (``replay(..., processes=P)``).

One Python process parses about 20,000 SSE chunks/s before chunks queue behind each other
(``benchmarks/client_capacity.py``): 1,000 streams at a 50 ms engine step are already that
many. Here P client processes (``spawn`` start method: a fresh interpreter each, never a fork of a
process with a running event loop) each run :class:`tuner.replay_client.Runner`
(:mod:`tuner.replay_child`: the process, and what it shares with this one, the parent):

* **One shared sequence.** The parent encodes every request body once into shared memory (an
  anonymous ``multiprocessing`` heap block, passed by file descriptor: no name to leak) in send
  order: warm-ups, then the measured requests (by arrival time for open loop). The processes take
  positions from a shared counter (a lock-protected integer, well under a microsecond to take
  uncontended), so each request is sent exactly once, by whichever process is free first.
* **Closed loop** at concurrency C: the C slots are split over the processes as evenly as
  possible (C = 10, P = 4: 3, 3, 2, 2); each slot takes the next request when its previous one
  ends, so exactly C are in flight, as in one process.
* **Open loop**: every process sends at the same absolute times (``time.perf_counter`` is
  CLOCK_MONOTONIC, one clock for all processes on Linux) relative to one start ``t0`` the parent
  picks once all are ready. A process takes the next arrival only when it can send it; with
  ``max_concurrency`` M that means when it holds a free slot of its share of M. The total in
  flight never exceeds M; an arrival waits for a slot of whichever process frees one first, as
  for one process's semaphore give or take an event-loop turn (approximate FIFO).
* **Warm-ups** go first, not measured: at the closed loop's slots, or one at a time (by the
  first process) for open loop; the parent waits for all of them before it picks ``t0``.
* **Records** go back to the parent as they finish (pickled over a socket pair, batched per
  event-loop turn); the parent calls ``on_record`` for each, and ``on_start(t0)``. ``t_sent_s``
  is relative to the common ``t0`` (the warm-up start for warm-ups), so records of all processes
  share one time axis.
* **Stopping.** When the replay ends, fails or is cancelled (a prune, Ctrl-C), the parent kills
  the processes that have not exited and reaps them. A process also dies with its parent: on
  Linux it asks the kernel for SIGKILL when the parent dies (``PR_SET_PDEATHSIG``), and it exits
  when the socket to the parent closes. It ignores SIGINT (Ctrl-C reaches the whole process
  group; the parent decides). The parent must call this from the thread that lives as long as
  the replay (the event loop's), since the death signal follows the thread that started it.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from tuner.errors import ReplayClientError
from tuner.records import RequestRecord, RequestSpec
from tuner.replay_child import (
    MEASURED,
    WARM,
    Claims,
    Plan,
    Table,
    child_main,
    frame,
    read_message,
)
from tuner.replay_client import ClientStats, Guarded, arrival_order, record_order

__all__ = ["replay_in_processes", "split_slots"]

log = logging.getLogger(__name__)

_START_MARGIN_S = 0.05
"""The common start is this far ahead of the moment the parent picks it, so every process has
received it before it passes (a process that gets it late starts at once)."""
_READY_TIMEOUT_S = 120.0
"""How long a client process may take to start (a fresh interpreter importing aiohttp)."""
_EXIT_GRACE_S = 10.0
"""How long a client process may take to close its connections and exit after the replay."""


def split_slots(total: int, parts: int) -> list[int]:
    """``total`` slots over ``parts`` processes as evenly as possible, larger shares first."""
    if parts < 1 or total < 0:
        raise ValueError(f"cannot split {total} slots over {parts} processes")
    base, extra = divmod(total, parts)
    return [base + (k < extra) for k in range(parts)]


class _Pool:
    """The client processes, their sockets, and what they send back."""

    def __init__(self, on_record: Callable[[RequestRecord], None] | None) -> None:
        self.procs: list[Any] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.pumps: list[asyncio.Task[None]] = []
        self.inbox: asyncio.Queue[tuple[int, tuple[Any, ...]]] = asyncio.Queue()
        self.records: list[RequestRecord] = []
        self.extra: dict[int, tuple[Any, ...]] = {}
        """What each process sent after the awaited message (``ready``: its loop and the
        collector's thresholds; ``done`` of the measured phase: its lag samples, CPU seconds and
        wall seconds)."""
        self.on_record = Guarded(on_record)

    async def start(
        self,
        ctx: Any,
        n: int,
        blob: Any,
        claims: Claims,
        client_loop: str = "asyncio",
        pause_gc: bool = True,
    ) -> None:
        for k in range(n):
            mine, theirs = socket.socketpair()
            try:
                proc = ctx.Process(
                    target=child_main,
                    args=(theirs, blob, claims, os.getpid(), client_loop, pause_gc),
                    name=f"tuner-replay-{k}",
                    daemon=True,
                )
                proc.start()
            except BaseException:
                mine.close()
                raise
            finally:
                theirs.close()  # the child has its own copy now
            self.procs.append(proc)
            reader, writer = await asyncio.open_connection(sock=mine)
            self.writers.append(writer)
            self.pumps.append(asyncio.create_task(self._pump(k, reader)))

    async def _pump(self, k: int, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                self.inbox.put_nowait((k, await read_message(reader)))
        except (asyncio.IncompleteReadError, ConnectionError):
            self.inbox.put_nowait((k, ("eof",)))
        except Exception as exc:  # an unreadable message: report it, don't hang the replay
            self.inbox.put_nowait((k, ("error", f"{type(exc).__name__}: {exc}", "")))

    def send(self, k: int, *msg: Any) -> None:
        self.writers[k].write(frame(msg))

    async def expect(self, *what: Any) -> None:
        """Wait until every process has sent ``what``; deliver records meanwhile."""
        pending = set(range(len(self.procs)))
        while pending:
            k, msg = await self.inbox.get()
            if msg[0] == "recs":
                for r in msg[1]:
                    self.records.append(r)
                    self.on_record(r)
            elif msg[: len(what)] == what:
                pending.discard(k)
                self.extra[k] = msg[len(what) :]
            elif msg[0] == "error":
                if msg[2]:
                    log.error("replay client process %d failed:\n%s", k, msg[2])
                raise ReplayClientError(f"replay client process {k} failed: {msg[1]}")
            elif msg[0] == "eof":
                code = await self._exitcode(k, 1.0)
                raise ReplayClientError(
                    f"replay client process {k} (pid {self.procs[k].pid}) exited unexpectedly"
                    + (f" with code {code}" if code is not None else "")
                )
            else:
                raise ReplayClientError(f"replay client process {k} sent {msg[0]!r}")

    async def _exitcode(self, k: int, wait_s: float) -> int | None:
        end = time.monotonic() + wait_s
        while self.procs[k].exitcode is None and time.monotonic() < end:
            await asyncio.sleep(0.01)
        code = self.procs[k].exitcode
        return int(code) if code is not None else None

    async def finish(self) -> None:
        """Tell every process to exit and wait for it (bounded)."""
        for k in range(len(self.procs)):
            self.send(k, "exit")
        for k in range(len(self.procs)):
            if await self._exitcode(k, _EXIT_GRACE_S) is None:
                log.warning("replay client process %d did not exit; killing it", k)

    def stop(self) -> None:
        """Kill what is still running and reap it (synchronous: safe in a cancelled task)."""
        for pump in self.pumps:
            pump.cancel()
        for proc in self.procs:
            if proc.exitcode is None:
                proc.kill()
        for proc in self.procs:
            proc.join(5.0)
            if proc.exitcode is None:
                log.warning("replay client process pid %s is still alive after SIGKILL", proc.pid)
        for writer in self.writers:
            writer.close()


async def replay_in_processes(
    base_url: str,
    model: str,
    warm: Sequence[RequestSpec],
    measured: Sequence[RequestSpec],
    *,
    processes: int,
    closed: bool,
    limit: int,
    duration_s: float,
    request_timeout_s: float,
    headers: dict[str, str],
    on_record: Callable[[RequestRecord], None] | None,
    on_start: Callable[[float], None] | None,
    client_loop: str = "asyncio",
    pause_gc: bool = True,
    stats: ClientStats | None = None,
) -> list[RequestRecord]:
    """:func:`tuner.replay.replay` over ``processes`` client processes (see the module doc).

    ``limit`` is the in-flight bound: the closed loop's concurrency, or the open loop's cap (0:
    none). Returns the records sorted as :func:`~tuner.replay.replay` does.
    """
    if processes < 2:
        raise ValueError(f"processes is {processes}; this path needs at least 2")
    if (closed and limit < processes) or (not closed and 0 < limit < processes):
        raise ValueError(f"{processes} processes for {limit} slots; use at most one per slot")
    ctx = mp.get_context("spawn")
    if not closed:
        measured = sorted(measured, key=arrival_order)
    table, blob = Table.build(warm, measured, model, ctx)
    claims = Claims(ctx)
    if closed:
        warm_slots = slots = split_slots(limit, processes)
    else:  # warm-ups one at a time, by the first process
        warm_slots = split_slots(1, processes)
        slots = split_slots(limit, processes) if limit else [0] * processes
    plans = [
        Plan(
            base_url=base_url,
            model=model,
            headers=headers,
            request_timeout_s=request_timeout_s,
            duration_s=duration_s,
            closed=closed,
            warm_slots=warm_slots[k],
            slots=slots[k] if closed or limit else None,
            table=table,
        )
        for k in range(processes)
    ]
    log.debug("replay over %d client processes, slots %s", processes, slots)
    pool = _Pool(on_record)
    t_spawn = time.perf_counter()
    try:
        await pool.start(ctx, processes, blob, claims, client_loop, pause_gc)
        for k, plan in enumerate(plans):
            pool.send(k, "plan", plan)
        try:
            async with asyncio.timeout(_READY_TIMEOUT_S):
                await pool.expect("ready")
        except TimeoutError:
            raise ReplayClientError(
                f"the replay client processes did not start in {_READY_TIMEOUT_S:.0f} s"
            ) from None
        # each replay starts its processes afresh, while the server waits: say what that costs
        log.info(
            "  replay client: %d processes ready in %.1f s",
            processes,
            time.perf_counter() - t_spawn,
        )
        for k in range(processes):
            log.debug(
                "replay client process %d: event loop %s, GC thresholds %s", k, *pool.extra[k]
            )
        if warm:
            t_warm = time.perf_counter() + _START_MARGIN_S
            for k in range(processes):
                pool.send(k, "run", WARM, t_warm)
            await pool.expect("done", WARM)
        t0 = time.perf_counter() + _START_MARGIN_S
        if on_start is not None:
            on_start(t0)
        for k in range(processes):
            pool.send(k, "run", MEASURED, t0)
        await pool.expect("done", MEASURED)
        if stats is not None:
            for k in range(processes):
                stats.add(*pool.extra[k])
        await pool.finish()
    finally:
        pool.stop()
    return sorted(pool.records, key=record_order)
