"""The asyncio side of the simulated engine: runs :class:`~tuner.sim.engine.Scheduler` steps in
(scaled) real time, streams tokens to per-request queues, and keeps vLLM's Prometheus metrics.

Step durations are simulated seconds divided by ``TUNER_SIM_SPEEDUP``; the loop sleeps with
``asyncio.sleep`` against a running deadline (so scheduling jitter does not accumulate) and costs
almost no CPU when idle. Metrics use a private ``CollectorRegistry`` with vLLM 0.24's names.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import AsyncIterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from tuner.sim.engine import Request, build_scheduler
from tuner.sim.logs import SimLog
from tuner.sim.startup import Settings

__all__ = ["AsyncEngine", "EngineDeadError", "Metrics"]

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
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            list(info),
            registry=reg,
        ).labels(**info).set(1)


@dataclasses.dataclass(eq=False)
class _Stream:
    req: Request
    queue: asyncio.Queue[int | None | BaseException]
    arrival_wall: float
    sent: int = 0
    first_wall: float | None = None


class AsyncEngine:
    """Owns the scheduler and the step loop; :meth:`generate` yields token counts per chunk."""

    def __init__(
        self, s: Settings, *, speedup: float, stream_interval: int, log: SimLog, log_stats: bool
    ) -> None:
        self.sched = build_scheduler(s.shape, s.resolved, s.memory)
        self.speedup = max(speedup, 1e-9)
        self.stream_interval = max(1, stream_interval)
        self.metrics = Metrics(s)
        self.log = log
        self.log_stats = log_stats
        self.dead = False
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._t0 = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._stats_task: asyncio.Task[None] | None = None
        self._last = dataclasses.replace(self.sched.stats)

    def sim_now(self) -> float:
        return (time.monotonic() - self._t0) * self.speedup

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())
        if self.log_stats:
            self._stats_task = asyncio.create_task(self._stats_loop())

    async def stop(self) -> None:
        for task in (self._task, self._stats_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def kill(self) -> None:
        """The engine died: fail every stream, refuse new work."""
        self.dead = True
        for st in list(self._streams.values()):
            st.queue.put_nowait(EngineDeadError())
        self._streams.clear()
        if self._task is not None:
            self._task.cancel()

    async def generate(self, tokens: Sequence[int], max_tokens: int) -> AsyncIterator[int]:
        """Yield the number of new tokens in each stream chunk until ``max_tokens`` were made."""
        if self.dead:
            raise EngineDeadError()
        rid = f"req-{next(self._ids)}"
        req = Request(rid, tokens, max_tokens)
        st = _Stream(req, asyncio.Queue(), time.monotonic())
        self._streams[rid] = st
        self.sched.add(req, self.sim_now())
        self._wake.set()
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
                self.sched.abort(req)
            self._streams.pop(rid, None)

    async def _loop(self) -> None:
        deadline = time.monotonic()
        while True:
            if not self.sched.has_work:
                self._update_gauges()
                self._wake.clear()
                await self._wake.wait()
                deadline = time.monotonic()
            res = self.sched.step(self.sim_now())
            now = time.monotonic()
            deadline = max(deadline, now - 0.05) + res.duration_s / self.speedup
            if res.idle:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, deadline - now))
                deadline = time.monotonic()
                self._update_gauges()
                continue
            await asyncio.sleep(max(0.0, deadline - now))
            self._deliver(res.emitted)
            self._update_gauges()

    def _deliver(self, emitted: Sequence[Request]) -> None:
        now = time.monotonic()
        m = self.metrics
        for req in emitted:
            st = self._streams.get(req.rid)
            if st is None:
                continue
            done = req.num_output >= req.max_tokens
            if req.num_output == 1:
                st.first_wall = now
                m.ttft.observe(now - st.arrival_wall)
            pending = req.num_output - st.sent
            if req.num_output == 1 or done or pending >= self.stream_interval:
                st.queue.put_nowait(pending)
                st.sent = req.num_output
            if done:
                m.e2e.observe(now - st.arrival_wall)
                m.success.labels(**m.success_lv, finished_reason="length").inc()
                st.queue.put_nowait(None)

    def _update_gauges(self) -> None:
        m, st, last = self.metrics, self.sched.stats, self._last
        m.running.set(len(self.sched.running))
        m.waiting.set(len(self.sched.waiting))
        m.kv_usage.set(self.sched.pool.usage())
        m.preemptions.inc(st.preemptions - last.preemptions)
        m.prefix_queries.inc(st.prefix_queries - last.prefix_queries)
        m.prefix_hits.inc(st.prefix_hits - last.prefix_hits)
        m.prompt_tokens.inc(st.prompt_tokens - last.prompt_tokens)
        m.generation_tokens.inc(st.generation_tokens - last.generation_tokens)
        self._last = dataclasses.replace(st)

    async def _stats_loop(self, interval: float = 10.0) -> None:
        prev = dataclasses.replace(self.sched.stats)
        while True:
            await asyncio.sleep(interval)
            st = self.sched.stats
            if st.steps == prev.steps and not self.sched.has_work:
                continue
            hit = (st.prefix_hits - prev.prefix_hits) / max(
                1, st.prefix_queries - prev.prefix_queries
            )
            prompt_tps = (st.prompt_tokens - prev.prompt_tokens) / interval
            gen_tps = (st.generation_tokens - prev.generation_tokens) / interval
            running, waiting = len(self.sched.running), len(self.sched.waiting)
            self.log.api(
                f"Engine 000: Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
                f"Avg generation throughput: {gen_tps:.1f} tokens/s, "
                f"Running: {running} reqs, Waiting: {waiting} reqs, "
                f"GPU KV cache usage: {100 * self.sched.pool.usage():.1f}%, "
                f"Prefix cache hit rate: {100 * hit:.1f}%",
                "loggers.py:259",
            )
            prev = dataclasses.replace(st)
