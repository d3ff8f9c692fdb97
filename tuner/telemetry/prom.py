"""vLLM's Prometheus ``/metrics``: parsing and a background scraper for the replay window."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tuner.aio import cancel_and_wait

__all__ = ["DEFAULT_NAMES", "SIM_NAMES", "MetricsScraper", "parse_metrics", "wait_idle"]

log = logging.getLogger(__name__)

DEFAULT_NAMES: tuple[str, ...] = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)
"""The vLLM 0.24 series the scraper keeps (gauges, and counters by their ``_total`` name). The
``spec_decode`` counters exist only with speculative decoding on (vLLM 0.24.0
``vllm/v1/spec_decode/metrics.py``: ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
``..._num_accepted_tokens``)."""
SIM_NAMES: tuple[str, ...] = (
    "tuner_sim:stream_lag_seconds_sum",
    "tuner_sim:stream_lag_seconds_count",
    "tuner_sim:stream_lag_max_seconds",
)
"""The simulator's lag histogram (``tuner/sim/runtime.py``), kept too where present (not on
vLLM)."""

_SKIP_SUFFIXES = ("_bucket", "_created", "_gsum", "_gcount")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``{sample name: value summed over label sets}``.

    Counters keep their ``_total`` sample name; histograms and summaries contribute ``_sum``
    and ``_count`` (buckets, quantiles and ``_created`` timestamps are dropped); NaN samples
    are skipped. Raises ``ValueError`` on text that is not the exposition format.
    """
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.endswith(_SKIP_SUFFIXES):
                continue
            if family.type == "summary" and name == family.name:
                continue  # quantile samples
            value = float(sample.value)
            if math.isnan(value):
                continue
            out[name] = out.get(name, 0.0) + value
    return out


class MetricsScraper:
    """Polls ``GET {base_url}/metrics`` every ``interval_s`` while the replay runs.

    ``async with MetricsScraper("http://127.0.0.1:8000") as s: ...`` takes a sample on entry,
    one per interval in a background task, and a last one on exit. Give an
    :class:`aiohttp.ClientSession` instead of a URL to reuse it (then ``base_url`` is its base
    URL, or pass ``base_url=``). ``samples`` holds ``{"t_s": seconds since entry, name: value}``
    for the ``names`` present; scrape failures are counted in ``errors`` (last one in
    ``last_error``) and never raised.

    On a normal exit a read still in flight is finished, not cancelled (at most ``timeout_s``):
    the simulator's ``tuner_sim:stream_lag_max_seconds`` is reset by every read, so a read
    cancelled after the server answered it took its value along. A fresh-clone CI run
    (2026-12-06) missed a 1 s stall of the simulator that way: the step was pruned right after
    the stall, the periodic read then in flight carried the 1 s, and the exit read found 0.
    """

    def __init__(
        self,
        session_or_base_url: aiohttp.ClientSession | str,
        interval_s: float = 1.0,
        names: Sequence[str] = DEFAULT_NAMES + SIM_NAMES,
        *,
        base_url: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        if isinstance(session_or_base_url, str):
            self._session: aiohttp.ClientSession | None = None
            self._own_session = True
            url = session_or_base_url
        else:
            self._session = session_or_base_url
            self._own_session = False
            url = base_url or ""  # "": the session's own base_url resolves "/metrics"
        self.url = url.rstrip("/") + "/metrics"
        self.interval_s = max(0.01, interval_s)
        self.names = tuple(names)
        self.timeout_s = timeout_s
        self.samples: list[dict[str, float]] = []
        self.errors = 0
        self.last_error: str | None = None
        self._t0 = 0.0
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def scrape_once(self) -> dict[str, float] | None:
        """One scrape appended to ``samples``; ``None`` (and ``errors`` + 1) if it failed."""
        assert self._session is not None, "use MetricsScraper as an async context manager"
        t = time.perf_counter() - self._t0
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._session.get(self.url) as resp:
                    if resp.status != 200:
                        raise ValueError(f"HTTP {resp.status}")
                    text = await resp.text(errors="replace")
            values = parse_metrics(text)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # network, HTTP, parse: counted, never raised
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.debug("metrics scrape failed: %s", self.last_error)
            return None
        sample: dict[str, float] = {"t_s": t}
        for name in self.names:
            if name in values:
                sample[name] = values[name]
        self.samples.append(sample)
        return sample

    async def _loop(self) -> None:
        next_at = time.perf_counter()
        while True:
            next_at += self.interval_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, next_at - time.perf_counter()))
            if self._stop.is_set():
                return
            await self.scrape_once()

    async def __aenter__(self) -> MetricsScraper:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self._t0 = time.perf_counter()
        self._stop.clear()
        await self.scrape_once()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            if exc_type is None:  # between reads, or once the read in flight has its answer
                self._stop.set()
                try:
                    await self._task
                finally:
                    self._task.cancel()  # this task cancelled while it waited: the loop too
            else:
                await cancel_and_wait(self._task)
            self._task = None
        try:
            if exc_type is None:
                await self.scrape_once()
        finally:
            if self._own_session and self._session is not None:
                await self._session.close()
                self._session = None

    def series(self, name: str) -> list[float]:
        """The values of ``name`` over time (samples that lack it are skipped)."""
        return [s[name] for s in self.samples if name in s]

    def summary(self) -> dict[str, float]:
        """Aggregates over the samples; a key is absent when its series is.

        ``kv_cache_usage_max``/``_mean`` (0..1), ``running_max``, ``waiting_max``,
        ``preemptions`` (delta), ``prompt_tokens``/``generation_tokens`` (deltas),
        ``prefix_cache_hit_rate`` (delta hits / delta queries, when queries grew),
        ``spec_decode_draft_tokens`` / ``spec_decode_accepted_tokens`` (deltas) and
        ``spec_decode_acceptance`` (accepted / drafted, when drafts grew: speculative decoding),
        ``sim_lag_mean_ms`` (the simulator only: how late its stream chunks left on average,
        wall ms after their modelled times), ``sim_lag_max_ms`` (its latest chunk during the
        replay: a stall of the host at its full length), ``scrape_errors``.
        """
        out: dict[str, float] = {"scrape_errors": float(self.errors)}
        kv = self.series("vllm:kv_cache_usage_perc")
        if kv:
            out["kv_cache_usage_max"] = max(kv)
            out["kv_cache_usage_mean"] = sum(kv) / len(kv)
        for key, name in (
            ("running_max", "vllm:num_requests_running"),
            ("waiting_max", "vllm:num_requests_waiting"),
        ):
            values = self.series(name)
            if values:
                out[key] = max(values)
        for key, name in (
            ("preemptions", "vllm:num_preemptions_total"),
            ("prompt_tokens", "vllm:prompt_tokens_total"),
            ("generation_tokens", "vllm:generation_tokens_total"),
        ):
            d = self._delta(name)
            if d is not None:
                out[key] = d
        hits = self._delta("vllm:prefix_cache_hits_total")
        queries = self._delta("vllm:prefix_cache_queries_total")
        if hits is not None and queries is not None and queries > 0:
            out["prefix_cache_hit_rate"] = hits / queries
        drafted = self._delta("vllm:spec_decode_num_draft_tokens_total")
        accepted = self._delta("vllm:spec_decode_num_accepted_tokens_total")
        if drafted is not None and accepted is not None:
            out["spec_decode_draft_tokens"] = drafted
            out["spec_decode_accepted_tokens"] = accepted
            if drafted > 0:
                out["spec_decode_acceptance"] = accepted / drafted
        lag = self._delta("tuner_sim:stream_lag_seconds_sum")
        chunks = self._delta("tuner_sim:stream_lag_seconds_count")
        if lag is not None and chunks:
            out["sim_lag_mean_ms"] = 1e3 * lag / chunks
        # the first read holds what came before the replay
        peaks = self.series("tuner_sim:stream_lag_max_seconds")[1:]
        if peaks:
            out["sim_lag_max_ms"] = 1e3 * max(peaks)
        return out

    def peak_within(self, name: str, start: float, end: float) -> float | None:
        """The largest value of ``name``, a gauge reset at each read (the simulator's
        ``tuner_sim:stream_lag_max_seconds``), over the reads whose span (since the read
        before) overlaps ``start`` … ``end`` (``time.perf_counter`` seconds); None without one.
        The first read, taken on entry, spans nothing."""
        peaks = []
        prev: float | None = None
        for sample in self.samples:
            t = self._t0 + sample["t_s"]  # perf_counter on entry + the read's offset
            if name in sample and prev is not None and t >= start and prev <= end:
                peaks.append(sample[name])
            prev = t
        return max(peaks) if peaks else None

    def _delta(self, name: str) -> float | None:
        values = self.series(name)
        if not values:
            return None
        return max(0.0, values[-1] - values[0])

    def to_jsonable(self) -> dict[str, Any]:
        return {"samples": self.samples, "errors": self.errors, "last_error": self.last_error}


_BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")


async def wait_idle(base_url: str, timeout_s: float = 120.0, poll_s: float = 0.25) -> bool:
    """Wait until the server neither runs nor queues a request (its ``/metrics``), at most
    ``timeout_s``; True if it did. After a replay stopped early, the server may still be working
    through the requests the client gave up on: the next measurement must not start on them."""
    async with MetricsScraper(base_url, interval_s=3600.0, names=_BUSY) as scraper:
        deadline = time.perf_counter() + timeout_s
        while True:
            sample = await scraper.scrape_once()
            if sample is not None and sum(sample.get(n, 0.0) for n in _BUSY) == 0:
                return True
            if time.perf_counter() >= deadline:
                return False
            await asyncio.sleep(poll_s)
