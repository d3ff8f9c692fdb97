"""The load generator: replays :class:`~tuner.records.RequestSpec` against an OpenAI server
(:func:`replay`: warm-ups, then the measured requests closed or open loop), and :func:`check`,
the config check of its client's endpoint and event loop.

Each request is sent and measured by the client of :mod:`tuner.replay_client` (what TTFT, ITL and
E2E are, and when a chunk's time is taken). Failed requests are records with
``status="error"``/``"timeout"``, never exceptions.

One Python process parses about 20,000 chunks/s before it queues them (1,000 streams at a 50 ms
engine step); ``replay(processes=P)`` spreads the requests over P client processes
(:mod:`tuner.replay_procs`) for loads beyond that.

While a replay runs, Python's garbage collector collects only its youngest generation
(:func:`tuner.replay_client.gc_paused`): a full collection stalls the event loop for 50-150 ms,
which lands on the tail of TTFT and ITL. A replay whose client ran late anyway is reported
(:data:`CLIENT_LAG_WARN_MS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence

from tuner.config import ENDPOINTS, ArrivalConfig, TunerConfig, one_of
from tuner.records import RequestRecord, RequestSpec
from tuner.replay_client import (
    ClientStats,
    LagProbe,
    Runner,
    arrival_order,
    client_session,
    gc_paused,
    loop_factory,
    record_order,
)
from tuner.replay_procs import replay_in_processes

__all__ = ["CLIENT_LAG_WARN_MS", "check", "replay"]

CLIENT_LAG_WARN_MS = 5.0
"""A replay whose client event loop ran later than this at p99 is reported (a warning per
trial, a line in the study's summary): the latencies it measured include that much of the
client's own queueing (docs/replay-accuracy.md)."""


def check(cfg: TunerConfig) -> None:
    """``workload.endpoint`` one the client posts to, ``workload.client_loop`` an event loop it
    can run (:func:`~tuner.replay_client.loop_factory`); else ConfigError, one line."""
    one_of("workload.endpoint", cfg.workload.endpoint, ENDPOINTS)
    loop_factory(cfg.workload.client_loop)


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


async def _closed_loop(
    runner: Runner, specs: Sequence[RequestSpec], concurrency: int, t0: float, deadline: float
) -> None:
    it: Iterator[RequestSpec] = iter(specs)

    async def worker() -> None:
        for spec in it:  # a shared iterator: each spec goes to exactly one worker
            if time.perf_counter() >= deadline:
                return
            await runner.send(spec, t0)

    workers = max(1, min(concurrency, len(specs)))
    await asyncio.gather(*(worker() for _ in range(workers)))


async def _open_loop(
    runner: Runner,
    specs: Sequence[RequestSpec],
    max_concurrency: int | None,
    t0: float,
    deadline: float,
) -> None:
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(spec: RequestSpec) -> None:
        if sem is None:
            await runner.send(spec, t0)
            return
        async with sem:
            if time.perf_counter() < deadline:  # may have waited past the deadline for a slot
                await runner.send(spec, t0)

    tasks: list[asyncio.Task[None]] = []
    try:
        for spec in sorted(specs, key=arrival_order):
            at = t0 + (spec.arrival_s or 0.0)
            if at >= deadline:
                break
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(spec)))
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()


async def replay(
    base_url: str,
    model: str,
    requests: Sequence[RequestSpec],
    arrival: ArrivalConfig,
    *,
    duration_s: float,
    request_timeout_s: float,
    api_key: str | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    on_start: Callable[[float], None] | None = None,
    processes: int = 1,
    client_loop: str = "asyncio",
    pause_gc: bool = True,
    stats: ClientStats | None = None,
) -> list[RequestRecord]:
    """Send ``requests`` to ``base_url`` (``http://host:port``) and measure each one.

    Warm-up specs go first (closed loop at ``arrival.concurrency``, or one by one for open-loop
    arrivals) and are awaited; then the clock starts for the measured ones. Closed loop
    (``arrival.kind == "concurrency"``) keeps ``arrival.concurrency`` requests in flight; open
    loop sends each spec at ``arrival_s`` after the start, at most ``arrival.max_concurrency``
    in flight if set. No request is sent once ``duration_s`` has passed since the start; those in
    flight get up to ``request_timeout_s`` to finish; unsent requests produce no record.

    Measured specs that carry ``arrival_s`` (a trace, see :func:`tuner.workload.build_requests`)
    are replayed open loop whatever ``arrival.kind`` says; ``arrival.max_concurrency`` still caps
    the requests in flight (an arrival waits for a free slot, so it is sent late).

    Returns every record (warm-ups included, ``warmup=True``) sorted by index. ``t_sent_s`` is
    relative to the measured start (to the warm-up start for warm-ups); ``on_start`` is called
    with that start (``time.perf_counter()``) so a caller can align records with other clocks.

    ``processes`` > 1 spreads the requests over that many client processes, for loads one
    process cannot parse without queueing (:mod:`tuner.replay_procs`: the in-flight bound is
    split over them, they pull from one shared sequence, records come back as they finish and
    ``on_record``/``on_start`` are called here). It never uses more processes than the bound
    allows (``arrival.concurrency``, or ``arrival.max_concurrency`` if set) or than there are
    measured requests; 1 (the default) replays in this process. Raises ValueError if it is < 1,
    :class:`~tuner.errors.ReplayClientError` if a client process fails. ``client_loop``
    (:func:`~tuner.replay_client.loop_factory`) is the client processes' event loop; with one
    process the replay runs on the caller's loop.

    Only young objects are garbage-collected in this process, and in the client processes, while
    it replays (:func:`~tuner.replay_client.gc_paused`; ``pause_gc=False`` leaves the collector
    alone, for ``benchmarks/client_capacity.py`` to measure the difference).

    ``stats``, if given, receives what the client itself cost while the measured requests ran
    (:class:`~tuner.replay_client.ClientStats`: its event-loop lag and CPU, per client process);
    with one process also when the replay is cancelled, with several only when it ends.
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes is {processes!r}; allowed: an integer >= 1")
    loop_factory(client_loop)  # fail before any process starts
    with gc_paused() if pause_gc else contextlib.nullcontext():
        measured = [s for s in requests if not s.warmup]
        closed = arrival.kind == "concurrency" and all(s.arrival_s is None for s in measured)
        # the connection pool is the in-flight bound; 0 means no limit (open loop without a cap)
        limit = max(1, arrival.concurrency) if closed else max(0, arrival.max_concurrency or 0)
        headers = _headers(api_key)
        warm = [s for s in requests if s.warmup]
        n_proc = min(processes, max(1, len(measured)), limit or processes)
        if n_proc > 1:
            return await replay_in_processes(
                base_url,
                model,
                warm,
                measured,
                processes=n_proc,
                closed=closed,
                limit=limit,
                duration_s=duration_s,
                request_timeout_s=request_timeout_s,
                headers=headers,
                on_record=on_record,
                on_start=on_start,
                client_loop=client_loop,
                pause_gc=pause_gc,
                stats=stats,
            )

        async with client_session(limit, request_timeout_s) as session:
            runner = Runner(session, base_url, model, request_timeout_s, headers, on_record)
            if warm:
                t_warm = time.perf_counter()
                await _closed_loop(
                    runner, warm, arrival.concurrency if closed else 1, t_warm, float("inf")
                )
            t0 = time.perf_counter()
            deadline = t0 + duration_s
            if on_start is not None:
                on_start(t0)
            probe = LagProbe()
            try:
                async with probe:
                    if closed:
                        await _closed_loop(runner, measured, arrival.concurrency, t0, deadline)
                    else:
                        await _open_loop(runner, measured, arrival.max_concurrency, t0, deadline)
            finally:
                if stats is not None:
                    stats.add(probe.lag_s, probe.cpu_s, probe.wall_s)
        return sorted(runner.records, key=record_order)
