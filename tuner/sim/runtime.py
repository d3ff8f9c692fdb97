"""The asyncio side of the simulated engine: runs :class:`~tuner.sim.engine.Scheduler` steps on
a modelled clock, streams tokens to per-request queues, and keeps vLLM's Prometheus metrics.

**The clock.** The engine keeps its own modelled time ``t`` (simulated seconds since start-up): a
step that starts at ``t`` and lasts ``d`` (the speed model's) ends at ``t + d``, the next step
starts there, and its tokens are due at the wall time ``t0 + (t + d) / TUNER_SIM_SPEEDUP``. The
loop computes a step, then sleeps until that absolute deadline: the host's overhead (Python,
HTTP, other processes) is not added to the model's time, and a loop that woke late runs the next
steps at once until it is back on time, instead of losing the time it was late. An idle engine
jumps its clock to the next request's arrival (stamped with the wall clock at arrival, in
modelled seconds). Admission (the front-end delay) is judged on the modelled clock too.

**When the host cannot keep up** the tokens leave late: every stream chunk's lateness (wall time
of its write minus its modelled time) goes to the ``tuner_sim:stream_lag_seconds`` histogram on
``/metrics`` (and the largest since the previous read to ``tuner_sim:stream_lag_max_seconds``),
and a WARNING line in the log says so when its p99 over the last
:data:`LAG_WINDOW_S` exceeds :data:`LAG_WARN_MS` (as the replay client's lag check does). The
latencies a client measures then include that lag; the model's own times do not move.

**Fewer events.** ``TUNER_SIM_STREAM_MS`` (wall milliseconds, default 0: off) holds a stream's
tokens until that long has passed (in modelled time, scaled) since its previous chunk, then sends
them in one chunk at the time of the last one, as vLLM's ``--stream-interval`` bundles tokens:
the first token and the last still leave at their own times, so TTFT, end-to-end latency and TPOT
((e2e − TTFT) / (tokens − 1)) are unchanged; only the gaps between chunks (ITL) are coarser. It
bounds the chunks per second a busy host must write and read to about running / interval.

**Data parallelism.** With ``--data-parallel-size`` DP > 1 the engine runs DP replicas (each a
scheduler with its own KV cache, modelled clock and step loop, as vLLM runs DP EngineCores each on
its own TP GPUs) behind the one HTTP front: each new request goes to the replica with the lowest
``4 x waiting + running`` (vLLM 0.24's ``DPLBAsyncMPClient.get_core_engine_for_request`` in
``vllm/v1/engine/core_client.py``; ties to the lowest index), read at once here where vLLM reads
counts its coordinator publishes every 100 ms. A request stays on its replica. ``/metrics`` sums
the replicas (KV usage: their mean); one step loop per replica, so the host's CPU cost grows with
DP while idle replicas cost nothing.

The loop costs almost no CPU when idle. Metrics use a private ``CollectorRegistry`` with vLLM
0.24's names, plus the ``tuner_sim:`` lag histogram.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import math
import time
from collections.abc import AsyncIterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from tuner.sim.engine import EngineStats, Request, Scheduler, build_scheduler
from tuner.sim.logs import SimLog
from tuner.sim.startup import Settings

__all__ = ["LAG_WARN_MS", "LAG_WINDOW_S", "AsyncEngine", "EngineDeadError", "LagMeter", "Metrics"]

LAG_WARN_MS = 5.0
"""A stream chunk's p99 lateness (ms, wall) over :data:`LAG_WINDOW_S` above which the log warns,
the replay client's threshold (``tuner.replay.CLIENT_LAG_WARN_MS``)."""
LAG_WINDOW_S = 5.0
"""How often (wall seconds) the lag check looks at the chunks written since its last look."""
LAG_BUCKETS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]

TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
E2E_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]


class EngineDeadError(Exception):
    def __init__(self) -> None:
        super().__init__(
            "EngineCore encountered an issue. See stack trace (above) for the root cause."
        )


class Metrics:
    """vLLM 0.24's Prometheus metrics (the subset the tuner reads), labels model_name and engine."""

    def __init__(self, s: Settings) -> None:
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        names = ["model_name", "engine"]
        lv = {"model_name": s.served_names[0], "engine": "0"}
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=reg)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=reg)

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        ).labels(**lv)
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(**lv)
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(**lv)
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(**lv)
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        ).labels(**lv)
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        ).labels(**lv)
        self.prompt_tokens = counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        ).labels(**lv)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(**lv)
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=reg,
        )
        self.success_lv = lv
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            names,
            buckets=TTFT_BUCKETS,
            registry=reg,
        ).labels(**lv)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            names,
            buckets=E2E_BUCKETS,
            registry=reg,
        ).labels(**lv)
        r = s.resolved
        info = {
            "block_size": str(r.block_size),
            "cache_dtype": r.kv_cache_dtype,
            "enable_prefix_caching": str(r.enable_prefix_caching),
            "gpu_memory_utilization": str(r.gpu_memory_utilization),
            "num_gpu_blocks": str(s.memory.kv_tokens // r.block_size),
            "kv_cache_memory_bytes": str(r.kv_cache_memory_bytes),
            "kv_cache_size_tokens": str(s.memory.kv_tokens),
            "kv_cache_max_concurrency": f"{s.memory.max_concurrency:.2f}",
            "engine": "0",
        }
        self.lag = Histogram(
            "tuner_sim:stream_lag_seconds",
            "Simulator only: how late each stream chunk was written, wall seconds after the "
            "modelled time of its last token (0 when the host keeps up).",
            names,
            buckets=LAG_BUCKETS,
            registry=reg,
        ).labels(**lv)
        self.lag_max = Gauge(
            "tuner_sim:stream_lag_max_seconds",
            "Simulator only: the latest stream chunk's lateness since the previous /metrics "
            "read (a stall of the host shows here at its full length).",
            names,
            registry=reg,
        ).labels(**lv)
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            list(info),
            registry=reg,
        ).labels(**info).set(1)


class LagMeter:
    """Stream chunks' lateness: each one into the histogram, and a window for the log's warning."""

    def __init__(self, metrics: Metrics, log: SimLog, warn_ms: float = LAG_WARN_MS) -> None:
        self.metrics = metrics
        self.log = log
        self.warn_ms = warn_ms
        self.window: collections.deque[float] = collections.deque(maxlen=200_000)
        self.warnings = 0
        self.max_since_read = 0.0

    def record(self, due_wall: float, now: float | None = None) -> float:
        """A chunk due at ``due_wall`` (monotonic seconds) was written at ``now``; its lag."""
        lag = max(0.0, (time.monotonic() if now is None else now) - due_wall)
        self.metrics.lag.observe(lag)
        self.window.append(lag)
        self.max_since_read = max(self.max_since_read, lag)
        return lag

    def publish_max(self) -> None:
        """Before ``/metrics`` is read: the latest chunk's lateness since the last read into
        ``tuner_sim:stream_lag_max_seconds``, then start again (the tuner's scraper reads each
        replay's)."""
        self.metrics.lag_max.set(self.max_since_read)
        self.max_since_read = 0.0

    def check(self, window_s: float) -> str | None:
        """The warning for the chunks since the last check, if their p99 lag is over the
        threshold (then also logged); empties the window."""
        if not self.window:
            return None
        lags = sorted(self.window)
        self.window.clear()
        p99 = lags[min(len(lags) - 1, math.ceil(0.99 * len(lags)) - 1)] * 1e3
        if p99 <= self.warn_ms:
            return None
        self.warnings += 1
        msg = (
            f"Simulator behind its model: stream chunks left {p99:.1f} ms late at p99 "
            f"(max {lags[-1] * 1e3:.1f} ms, {len(lags)} chunks in the last {window_s:.0f} s); "
            "the latencies clients measure include that delay: the host's CPU is busy (give the "
            "simulator a core, lower TUNER_SIM_SPEEDUP or raise TUNER_SIM_STREAM_MS)"
        )
        self.log.api(msg, "sim_clock.py:1", "WARNING")
        return msg


@dataclasses.dataclass(eq=False)
class _Stream:
    req: Request
    queue: asyncio.Queue[tuple[int, float] | None | BaseException]
    arrival_wall: float
    sent: int = 0
    last_chunk_t: float = -math.inf
    """Modelled time of the stream's previous chunk."""


@dataclasses.dataclass(eq=False)
class _Replica:
    """One DP engine replica: its scheduler, its modelled clock and the event that wakes it."""

    index: int
    sched: Scheduler
    t: float = 0.0
    """The modelled clock: where the next step starts (simulated seconds since start)."""
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    last: EngineStats = dataclasses.field(default_factory=EngineStats)
    """Its stats when the counters were last advanced."""

    @property
    def load(self) -> int:
        """vLLM's DP balancing score: ``4 x waiting + running``."""
        return 4 * len(self.sched.waiting) + len(self.sched.running)


class AsyncEngine:
    """Owns the schedulers (one per DP replica) and their step loops on the modelled clock
    (module docstring); :meth:`generate` yields each stream chunk's token count and its due wall
    time."""

    def __init__(
        self,
        s: Settings,
        *,
        speedup: float,
        stream_interval: int,
        log: SimLog,
        log_stats: bool,
        stream_ms: float = 0.0,
    ) -> None:
        dp = max(1, s.resolved.data_parallel_size)
        self.replicas = [
            _Replica(k, build_scheduler(s.shape, s.resolved, s.memory)) for k in range(dp)
        ]
        self.speedup = max(speedup, 1e-9)
        self.stream_interval = max(1, stream_interval)
        self.hold_s = max(0.0, stream_ms) / 1e3 * self.speedup
        """Modelled seconds a stream holds its tokens (``TUNER_SIM_STREAM_MS``, scaled)."""
        self.metrics = Metrics(s)
        self.lag = LagMeter(self.metrics, log)
        self.log = log
        self.log_stats = log_stats
        self.dead = False
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._t0 = time.monotonic()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def sched(self) -> Scheduler:
        """The first replica's scheduler (the only one without DP)."""
        return self.replicas[0].sched

    @property
    def t(self) -> float:
        """The modelled clock of the replica furthest on."""
        return max(rep.t for rep in self.replicas)

    def stats(self) -> EngineStats:
        """The replicas' counters summed."""
        out = EngineStats()
        for rep in self.replicas:
            for f in dataclasses.fields(EngineStats):
                setattr(out, f.name, getattr(out, f.name) + getattr(rep.sched.stats, f.name))
        return out

    def reset_prefix_cache(self) -> bool:
        """Every replica's (vLLM resets each engine's); False if one could not."""
        return all([rep.sched.pool.reset_prefix_cache() for rep in self.replicas])

    def _pick(self) -> _Replica:
        """The replica a new request goes to: the lowest load, the lowest index on a tie."""
        return min(self.replicas, key=lambda rep: (rep.load, rep.index))

    def sim_now(self) -> float:
        """The wall clock in modelled seconds since start."""
        return (time.monotonic() - self._t0) * self.speedup

    def wall_at(self, t: float) -> float:
        """The monotonic wall time of modelled time ``t``."""
        return self._t0 + t / self.speedup

    def start(self) -> None:
        for rep in self.replicas:
            self._tasks.append(asyncio.create_task(self._loop(rep)))
        self._tasks.append(asyncio.create_task(self._lag_loop()))
        if self.log_stats:
            self._tasks.append(asyncio.create_task(self._stats_loop()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def kill(self) -> None:
        """The engine died: fail every stream, refuse new work."""
        self.dead = True
        for st in list(self._streams.values()):
            st.queue.put_nowait(EngineDeadError())
        self._streams.clear()
        for task in self._tasks[: len(self.replicas)]:  # the step loops
            task.cancel()

    async def generate(
        self, tokens: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, float]]:
        """Yield ``(new tokens, due wall time)`` per stream chunk until ``max_tokens`` were made;
        the caller reports when it wrote the chunk to :attr:`lag`."""
        if self.dead:
            raise EngineDeadError()
        rid = f"req-{next(self._ids)}"
        req = Request(rid, tokens, max_tokens)
        st = _Stream(req, asyncio.Queue(), time.monotonic())
        self._streams[rid] = st
        rep = self._pick()
        rep.sched.add(req, self.sim_now())
        rep.wake.set()
        try:
            while True:
                item = await st.queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not req.finished and not self.dead:
                rep.sched.abort(req)
            self._streams.pop(rid, None)

    async def _until(self, rep: _Replica, t: float) -> bool:
        """Sleep until modelled time ``t`` is due on the wall clock, or a request arrives at
        ``rep``; True if it is due."""
        delay = self.wall_at(t) - time.monotonic()
        if delay <= 0:
            return True
        rep.wake.clear()
        try:
            await asyncio.wait_for(rep.wake.wait(), delay)
        except TimeoutError:
            return True
        return False

    async def _loop(self, rep: _Replica) -> None:
        sched = rep.sched
        while True:
            if not sched.has_work:
                self._update_gauges()
                rep.wake.clear()
                await rep.wake.wait()
                continue
            if not sched.running:  # an idle clock jumps to the first arrival it has not seen
                rep.t = max(rep.t, min(r.arrival_s for r in sched.waiting))
            res = sched.step(rep.t)
            if res.idle:  # waiting requests not past the front end yet: until the first is
                target = rep.t + res.duration_s
                if await self._until(rep, target):
                    rep.t = target
                else:  # a request arrived meanwhile
                    rep.t = max(rep.t, min(target, self.sim_now()))
                self._update_gauges()
                continue
            end = rep.t + res.duration_s
            due = self.wall_at(end)
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            rep.t = end
            self._deliver(res.emitted, end, due)
            self._update_gauges()

    def _deliver(self, emitted: Sequence[Request], t: float, due: float) -> None:
        """Hand the tokens of the step that ended at modelled ``t`` (wall ``due``) to their
        streams: one chunk each where :attr:`stream_interval` / :attr:`hold_s` allow."""
        now = time.monotonic()
        m = self.metrics
        for req in emitted:
            st = self._streams.get(req.rid)
            if st is None:
                continue
            done = req.num_output >= req.max_tokens
            if req.num_output == 1:
                m.ttft.observe(now - st.arrival_wall)
            pending = req.num_output - st.sent
            if (
                req.num_output == 1
                or done
                or (pending >= self.stream_interval and t - st.last_chunk_t >= self.hold_s)
            ):
                st.queue.put_nowait((pending, due))
                st.sent = req.num_output
                st.last_chunk_t = t
            if done:
                m.e2e.observe(now - st.arrival_wall)
                m.success.labels(**m.success_lv, finished_reason="length").inc()
                st.queue.put_nowait(None)

    def _update_gauges(self) -> None:
        m, reps = self.metrics, self.replicas
        m.running.set(sum(len(rep.sched.running) for rep in reps))
        m.waiting.set(sum(len(rep.sched.waiting) for rep in reps))
        m.kv_usage.set(sum(rep.sched.pool.usage() for rep in reps) / len(reps))
        for rep in reps:
            st, last = rep.sched.stats, rep.last
            m.preemptions.inc(st.preemptions - last.preemptions)
            m.prefix_queries.inc(st.prefix_queries - last.prefix_queries)
            m.prefix_hits.inc(st.prefix_hits - last.prefix_hits)
            m.prompt_tokens.inc(st.prompt_tokens - last.prompt_tokens)
            m.generation_tokens.inc(st.generation_tokens - last.generation_tokens)
            rep.last = dataclasses.replace(st)

    async def _lag_loop(self, interval: float = LAG_WINDOW_S) -> None:
        while True:
            await asyncio.sleep(interval)
            self.lag.check(interval)

    async def _stats_loop(self, interval: float = 10.0) -> None:
        prev = self.stats()
        while True:
            await asyncio.sleep(interval)
            st = self.stats()
            if st.steps == prev.steps and not any(rep.sched.has_work for rep in self.replicas):
                continue
            hit = (st.prefix_hits - prev.prefix_hits) / max(
                1, st.prefix_queries - prev.prefix_queries
            )
            prompt_tps = (st.prompt_tokens - prev.prompt_tokens) / interval
            gen_tps = (st.generation_tokens - prev.generation_tokens) / interval
            running = sum(len(rep.sched.running) for rep in self.replicas)
            waiting = sum(len(rep.sched.waiting) for rep in self.replicas)
            usage = sum(rep.sched.pool.usage() for rep in self.replicas) / len(self.replicas)
            self.log.api(
                f"Engine 000: Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
                f"Avg generation throughput: {gen_tps:.1f} tokens/s, "
                f"Running: {running} reqs, Waiting: {waiting} reqs, "
                f"GPU KV cache usage: {100 * usage:.1f}%, "
                f"Prefix cache hit rate: {100 * hit:.1f}%",
                "loggers.py:259",
            )
            prev = dataclasses.replace(st)
