"""One replay client process of :mod:`tuner.replay_procs`, and what it shares with the parent.

What the parent gives each process: the requests in send order (:class:`Table`, their encoded
bodies in one shared-memory block), the shared counter of the next unclaimed position
(:class:`Claims`) and what this process does (:class:`Plan`); they talk in length-prefixed pickles
over a socket pair (:func:`frame`, :func:`read_message`).

:func:`child_main` is the process's entry point. It runs :class:`tuner.replay_client.Runner` over
the positions it claims, one phase at a time as the parent says (``run``: :data:`WARM`, then
:data:`MEASURED`, each from a start time the parent picked), and sends back its records (batched
per event-loop turn), ``ready`` and ``done`` (with what it cost while measured requests ran), or
``error``. It dies with its parent: on Linux it asks the kernel for SIGKILL when the parent dies
(``PR_SET_PDEATHSIG``), and it exits when the socket to the parent closes. It ignores SIGINT
(Ctrl-C reaches the whole process group; the parent decides).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import ctypes
import gc
import math
import os
import pickle
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuner.records import RequestRecord, RequestSpec
from tuner.replay_client import (
    LagProbe,
    Runner,
    client_session,
    encode_body,
    gc_paused,
    loop_factory,
)

__all__ = ["MEASURED", "WARM", "Claims", "Plan", "Table", "child_main", "frame", "read_message"]

WARM, MEASURED = 0, 1
"""The phases: warm-ups (not measured), then the measured requests."""
_HEADER = struct.Struct("!I")
_ENDPOINTS = ("chat", "completions")
"""A request's endpoint, as its index in :attr:`Table.endpoint`."""


# --- what the processes share ------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """The requests in send order (warm-ups first); position ``p``'s encoded body is
    ``blob[bounds[p]:bounds[p + 1]]``."""

    index: array.array[int]
    endpoint: bytes
    """Per position, the index of its endpoint in ``_ENDPOINTS``."""
    arrival: array.array[float]
    """Per position, ``arrival_s`` (NaN for None)."""
    bounds: array.array[int]
    n_warm: int

    @property
    def n(self) -> int:
        return len(self.index)

    def offset(self, pos: int) -> float:
        """When to send, after the start (no ``arrival_s``: at once, as in one process)."""
        arrival = self.arrival[pos]
        return 0.0 if math.isnan(arrival) else arrival

    def spec(self, pos: int) -> RequestSpec:
        """A spec carrying what the runner needs besides the body (index, endpoint, warm-up)."""
        arrival = self.arrival[pos]
        return RequestSpec(
            index=self.index[pos],
            endpoint=_ENDPOINTS[self.endpoint[pos]],  # type: ignore[arg-type]
            body={},
            prompt_tokens=0,
            output_tokens=0,
            arrival_s=None if math.isnan(arrival) else arrival,
            warmup=pos < self.n_warm,
        )

    @staticmethod
    def build(
        warm: Sequence[RequestSpec], measured: Sequence[RequestSpec], model: str, ctx: Any
    ) -> tuple[Table, Any]:
        """The send order (``warm`` then ``measured``) and the shared block of encoded bodies
        (a ``RawArray`` of ``ctx``, the parent's ``spawn`` context)."""
        order = [*warm, *measured]
        bodies = [encode_body(s, model) for s in order]
        bounds = array.array("q", [0])
        for b in bodies:
            bounds.append(bounds[-1] + len(b))
        blob = ctx.RawArray("B", max(1, bounds[-1]))
        view = memoryview(blob).cast("B")
        for b, lo in zip(bodies, bounds, strict=False):
            view[lo : lo + len(b)] = b
        view.release()
        table = Table(
            index=array.array("q", (s.index for s in order)),
            endpoint=bytes(_ENDPOINTS.index(s.endpoint) for s in order),
            arrival=array.array(
                "d", (math.nan if s.arrival_s is None else s.arrival_s for s in order)
            ),
            bounds=bounds,
            n_warm=len(warm),
        )
        return table, blob


class Claims:
    """The next unclaimed position of each phase (warm-up, measured), shared by the processes."""

    def __init__(self, ctx: Any) -> None:
        self._next = ctx.RawArray("q", 2)
        self._lock = ctx.Lock()

    def take(self, phase: int) -> int:
        with self._lock:
            pos = int(self._next[phase])
            self._next[phase] = pos + 1
        return pos


@dataclass(frozen=True)
class Plan:
    """What one client process does; sent to it over its socket once it runs."""

    base_url: str
    model: str
    headers: dict[str, str]
    request_timeout_s: float
    duration_s: float
    closed: bool
    warm_slots: int
    """Warm-up requests this process keeps in flight (closed loop)."""
    slots: int | None
    """Measured requests this process keeps in flight (closed loop), or its share of the
    open-loop cap (None: no cap)."""
    table: Table


# --- framing: length-prefixed pickles over a socket pair ---------------------------------------


def frame(msg: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


async def read_message(reader: asyncio.StreamReader) -> tuple[Any, ...]:
    (n,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    msg = pickle.loads(await reader.readexactly(n))
    assert isinstance(msg, tuple)
    return msg


# --- the client process ------------------------------------------------------------------------


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux), and exit now if it already has."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def child_main(
    sock: socket.socket,
    blob: Any,
    claims: Claims,
    parent_pid: int,
    client_loop: str,
    pause_gc: bool,
) -> None:
    """Entry point of a client process (spawned: nothing of the parent's loop is inherited)."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops us
    paused = gc_paused() if pause_gc else contextlib.nullcontext()
    with paused, asyncio.Runner(loop_factory=loop_factory(client_loop)) as runner:
        runner.run(_child(sock, blob, claims))


class _Outbox:
    """Messages to the parent; records finished in one event-loop turn go as one message."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.pending: list[RequestRecord] = []

    def record(self, record: RequestRecord) -> None:
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self.pending.append(record)

    def flush(self) -> None:
        if self.pending:
            self.writer.write(frame(("recs", self.pending)))
            self.pending = []

    def send(self, *msg: Any) -> None:
        self.flush()  # records before what follows them
        self.writer.write(frame(msg))


async def _control(reader: asyncio.StreamReader, inbox: asyncio.Queue[tuple[Any, ...]]) -> None:
    """The parent's messages, until ``exit``; the socket closing means the parent is gone."""
    while True:
        try:
            msg = await read_message(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            os._exit(1)  # nobody is left to report to: drop the connections with the process
        inbox.put_nowait(msg)
        if msg[0] == "exit":
            return


async def _child(sock: socket.socket, blob: Any, claims: Claims) -> None:
    reader, writer = await asyncio.open_connection(sock=sock)
    out = _Outbox(writer)
    inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    control = asyncio.create_task(_control(reader, inbox))
    try:
        kind, plan = await inbox.get()
        assert kind == "plan" and isinstance(plan, Plan)
        # the connection pool is this process's in-flight bound (0: none, open loop uncapped)
        limit = max(plan.warm_slots, plan.slots or 0) if plan.closed else plan.slots or 0
        async with client_session(limit, plan.request_timeout_s) as session:
            runner = Runner(
                session, plan.base_url, plan.model, plan.request_timeout_s, plan.headers, out.record
            )
            body = memoryview(blob).cast("B")
            # what this process runs on, for the parent's debug log
            loop = type(asyncio.get_running_loop())
            out.send("ready", f"{loop.__module__}.{loop.__qualname__}", gc.get_threshold())
            while (msg := await inbox.get())[0] == "run":
                _, phase, t_start = msg
                if phase == MEASURED:  # what this process costs while measured requests run
                    async with LagProbe() as probe:
                        await _run_phase(runner, plan, body, claims, phase, t_start)
                    out.send("done", phase, probe.lag_s, probe.cpu_s, probe.wall_s, probe.at_s)
                else:
                    await _run_phase(runner, plan, body, claims, phase, t_start)
                    out.send("done", phase)
                await writer.drain()
    except Exception as exc:
        out.send("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    finally:
        control.cancel()
        out.flush()
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()


async def _run_phase(
    runner: Runner, plan: Plan, body: memoryview, claims: Claims, phase: int, t_start: float
) -> None:
    table = plan.table
    first, n = (0, table.n_warm) if phase == WARM else (table.n_warm, table.n - table.n_warm)
    deadline = float("inf") if phase == WARM else t_start + plan.duration_s
    delay = t_start - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)

    def take() -> int | None:
        """The next position of this phase, or None when all are taken."""
        i = claims.take(phase)
        return first + i if i < n else None

    async def send(pos: int) -> None:
        lo, hi = table.bounds[pos], table.bounds[pos + 1]
        await runner.send(table.spec(pos), t_start, bytes(body[lo:hi]))

    if phase == WARM or plan.closed:
        slots = plan.warm_slots if phase == WARM else plan.slots or 0

        async def worker() -> None:
            while (pos := take()) is not None:
                if time.perf_counter() >= deadline:
                    return
                await send(pos)

        await asyncio.gather(*(worker() for _ in range(min(slots, n))))
        return

    # open loop: take an arrival only when it can be sent (a free slot of this process's share)
    sem = asyncio.Semaphore(plan.slots) if plan.slots is not None else None
    tasks: set[asyncio.Task[None]] = set()

    async def one(pos: int) -> None:
        try:
            await send(pos)
        finally:
            if sem is not None:
                sem.release()

    while True:
        if sem is not None:
            await sem.acquire()
        pos = take()
        at = deadline if pos is None else t_start + table.offset(pos)
        if pos is None or at >= deadline or time.perf_counter() >= deadline:
            if sem is not None:
                sem.release()
            break
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(pos))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
