"""The load generator: replays :class:`~tuner.records.RequestSpec` against an OpenAI server
(:func:`replay`: warm-ups, then the measured requests closed or open loop), and :func:`check`,
the config check of its client's endpoint and event loop.

Each request is sent and measured by the client of :mod:`tuner.replay_client` (what TTFT, ITL and
E2E are, and when a chunk's time is taken). Failed requests are records with
``status="error"``/``"timeout"``, never exceptions.

One Python process parses about 20,000 chunks/s before it queues them (1,000 streams at a 50 ms
engine step); ``replay(processes=P)`` spreads the requests over P client processes
(:mod:`tuner.replay_procs`) for loads beyond that. How many a replay takes
(``workload.client_processes``, by default ``auto``: from that replay's requests in flight and the
cores the client may use) is decided by :func:`choose_client`, for every replay the tuner runs
(trials, repeats, capacity steps, confirm runs), so it follows each replay's own load.

While a replay runs, Python's garbage collector collects only its youngest generation
(:func:`tuner.replay_client.gc_paused`): a full collection stalls the event loop for 50-150 ms,
which lands on the tail of TTFT and ITL. A replay whose client ran late anyway is reported
(:data:`CLIENT_LAG_WARN_MS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from tuner.config import (
    ENDPOINTS,
    ArrivalConfig,
    EngineConfig,
    TunerConfig,
    WorkloadConfig,
    one_of,
    usable_cores,
)
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

__all__ = [
    "CLIENT_LAG_WARN_MS",
    "IN_PROCESS_STREAMS",
    "STEP_S",
    "STREAMS_PER_PROCESS",
    "ClientChoice",
    "check",
    "choose_client",
    "client_cores",
    "in_flight",
    "is_closed_loop",
    "processes_for",
    "replay",
]

CLIENT_LAG_WARN_MS = 5.0
"""A replay whose client event loop ran later than this at p99 is reported (a warning per
trial, a line in the study's summary): the latencies it measured include that much of the
client's own queueing (docs/replay-accuracy.md)."""


# --- how many client processes a replay takes (workload.client_processes=auto) ----------------

STREAMS_PER_PROCESS = 16
"""``auto``: at most this many streams (requests in flight) per client process. An engine step
delivers one chunk to every open stream at once, and a process reads its share of that burst one
chunk at a time, so its last stream waits for the others. On the 16-core H200 host
(docs/gpu-runs/2026-12-01-client-auto.md, 64 paced streams at 25 ms steps, two replays each):
32 streams a process (2 processes) added 1.33-1.41 ms at p99, 16 a process (4) 0.91-0.98 ms.
Beyond the cores usable the count is capped, and there the p99 varied from run to run (1,000
streams over 11 processes: 0.84-4.2 ms in four replays)."""

IN_PROCESS_STREAMS = 8
"""``auto``: up to this many streams the replay stays in the tuner's own process (no process to
start, as before ``auto``); above it, separate client processes. The tuner's process reads a
chunk several times slower than a client process of its own (it also runs the telemetry and the
trials' bookkeeping, on a heap of Optuna, MLflow and SQLAlchemy): at 64 streams on vLLM its event
loop ran 5.2-5.8 ms late at p99 (issue 21), ~85 us a stream, so 8 streams is about 0.7 ms; in
the benchmark's process holding the tuner's heap, 64 streams added 2.4-3.3 ms (~45 us each)."""

STEP_S = 0.025
"""``auto``, open loop: the engine step (one chunk per stream) assumed when estimating how long a
stream stays open: vLLM's TPOT on the H200 at 64-256 in flight was 20-25 ms
(docs/gpu-runs/2026-12-01-capacity.md)."""


def is_closed_loop(arrival: ArrivalConfig, requests: Sequence[RequestSpec]) -> bool:
    """Whether ``requests`` replay closed loop: ``arrival.kind`` is ``concurrency`` and no measured
    request carries a send time (a trace's do)."""
    measured = (s for s in requests if not s.warmup)
    return arrival.kind == "concurrency" and all(s.arrival_s is None for s in measured)


def in_flight(arrival: ArrivalConfig, requests: Sequence[RequestSpec]) -> int:
    """How many requests a replay of ``requests`` has in flight at most, for ``auto``.

    Closed loop: its concurrency. Open loop (a rate, a ramp, a trace): an estimate by Little's law
    over the busiest stretch, the most measured requests that arrive within one stream's expected
    duration (their mean output tokens x :data:`STEP_S`), capped by ``arrival.max_concurrency``
    if set. Never more than the measured requests, at least 1.
    """
    measured = [s for s in requests if not s.warmup]
    if not measured:
        return 1
    if is_closed_loop(arrival, requests):
        return max(1, min(arrival.concurrency, len(measured)))
    times = sorted(s.arrival_s or 0.0 for s in measured)
    open_s = STEP_S * statistics.fmean(s.output_tokens for s in measured)
    most, first = 1, 0
    for last, t in enumerate(times):
        while t - times[first] > open_s:
            first += 1
        most = max(most, last - first + 1)
    if arrival.max_concurrency:
        most = min(most, arrival.max_concurrency)
    return most


def client_cores(engine: EngineConfig) -> tuple[int, str]:
    """The CPU cores ``auto`` spreads the client over, and where that number comes from: with
    ``engine.cpu_pinning`` (and ``cpu_reserve`` >= 1) the cores kept for the tuner
    (:func:`tuner.engine.pool.reserved_cores`: the servers have the rest); otherwise this
    process's cores less one per GPU of ``engine.gpus``, whose server needs one for its engine
    loop. At least 1. (Trials running at once, ``study.n_workers`` > 1, each take this many.)"""
    cores = usable_cores()
    if engine.cpu_pinning and engine.cpu_reserve > 0:
        n = min(cores, engine.cpu_reserve)
        return n, f"engine.cpu_reserve={engine.cpu_reserve} under engine.cpu_pinning"
    gpus = len(engine.gpus)
    have = f"{cores} core{'s' if cores > 1 else ''}"
    return max(1, cores - gpus), f"{have} less {gpus} for the server{'s' if gpus > 1 else ''}"


def processes_for(bound: int, cores: int) -> int:
    """``auto``'s rule: the client processes for a replay with at most ``bound`` requests in
    flight on ``cores`` usable cores. 1, the replay in the tuner's own process, up to
    :data:`IN_PROCESS_STREAMS`; above, separate client processes, at most
    :data:`STREAMS_PER_PROCESS` streams each and at least 2 (1 would be the tuner's own process),
    never more than ``cores`` or ``bound`` (1 when one core is all there is)."""
    if bound <= IN_PROCESS_STREAMS:
        return 1
    wanted = max(2, math.ceil(bound / STREAMS_PER_PROCESS))
    return max(1, min(wanted, cores, bound))


@dataclass(frozen=True)
class ClientChoice:
    """The client processes of one replay (:func:`choose_client`) and why."""

    processes: int
    """What the replay runs with (``replay(processes=...)``; 1: in the tuner's own process)."""
    in_flight: int
    """Its requests in flight (:func:`in_flight`)."""
    auto: bool
    """``workload.client_processes`` is ``auto`` (else the count it gives)."""
    cores: int
    cores_from: str
    """:func:`client_cores`."""

    @property
    def wanted(self) -> int:
        """What ``auto`` takes for this load on enough cores."""
        return processes_for(self.in_flight, self.in_flight)

    @property
    def held(self) -> bool:
        """``auto`` took fewer processes than the load calls for: the cores held it."""
        return self.auto and self.processes < self.wanted

    def describe(self) -> str:
        """One line: the processes, the requests in flight and why that many."""
        p, b = self.processes, self.in_flight
        what = "1 process, the tuner's own" if p == 1 else f"{p} processes"
        load = f"{b} request{'s' if b > 1 else ''} in flight"
        if not self.auto:
            per = f" ({math.ceil(b / p)} per process)" if p > 1 else ""
            return f"{what} (workload.client_processes={p}), {load}{per}"
        if self.held:
            w = self.wanted
            return (
                f"{what} (auto): {load} call for {w} (at most {STREAMS_PER_PROCESS} streams "
                f"each), held to {p} by the cores usable ({self.cores_from})"
            )
        if p == 1:
            return f"{what} (auto), {load}: up to {IN_PROCESS_STREAMS} stay in it"
        return (
            f"{what} (auto), {load}: at most {STREAMS_PER_PROCESS} streams each "
            f"({math.ceil(b / p)} here; {self.cores} cores usable)"
        )

    def hint(self) -> str:
        """What to change when this client ran late."""
        if not self.auto:
            return f"raise workload.client_processes (now {self.processes})"
        if self.held:
            return (
                f"auto was held to {self.processes} client process(es) by the cores usable "
                f"({self.cores_from}); it would take {self.wanted}, one per "
                f"{STREAMS_PER_PROCESS} requests in flight: give the client more cores"
            )
        return (
            f"auto chose {self.processes} client process(es) for {self.in_flight} in flight; "
            f"set workload.client_processes higher (up to {self.cores} here)"
        )


def choose_client(
    workload: WorkloadConfig, engine: EngineConfig, requests: Sequence[RequestSpec]
) -> ClientChoice:
    """The client processes of a replay of ``requests`` under ``workload`` (with that replay's
    own load: a capacity step's, a confirm run's): ``workload.client_processes`` if it is a
    count, else ``auto``'s (:func:`processes_for` of :func:`in_flight` and
    :func:`client_cores`)."""
    bound = in_flight(workload.arrival, requests)
    cores, cores_from = client_cores(engine)
    wanted = workload.client_processes
    if isinstance(wanted, int):
        return ClientChoice(wanted, bound, False, cores, cores_from)
    return ClientChoice(processes_for(bound, cores), bound, True, cores, cores_from)


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
        closed = is_closed_loop(arrival, requests)
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
                    stats.add(probe.lag_s, probe.cpu_s, probe.wall_s, probe.at_s)
        return sorted(runner.records, key=record_order)
