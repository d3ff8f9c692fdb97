"""tuner.telemetry: Prometheus parsing/scraping and NVML sampling (with and without a GPU)."""

from __future__ import annotations

import asyncio
import socket
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tuner.engine.gpu_memory import gpu_freed
from tuner.errors import EngineError
from tuner.telemetry import gpu
from tuner.telemetry.prom import DEFAULT_NAMES, MetricsScraper, parse_metrics

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4375
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7523e+09
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 12800.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 3200.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 51200.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 6400.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 400.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 10.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 40.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 0.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 30.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 50.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 50.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 4.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2048"} 1.0
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
"""


def test_parse_metrics_vllm_sample() -> None:
    m = parse_metrics(METRICS)
    assert m["vllm:num_requests_running"] == 12.0  # summed over engines
    assert m["vllm:num_requests_waiting"] == 2.0
    assert m["vllm:kv_cache_usage_perc"] == 0.4375
    assert m["vllm:num_preemptions_total"] == 3.0
    assert m["vllm:prefix_cache_hits_total"] == 3200.0
    assert m["vllm:request_success_total"] == 50.0
    assert m["vllm:time_to_first_token_seconds_sum"] == 4.25
    assert m["vllm:time_to_first_token_seconds_count"] == 50.0
    assert m["vllm:cache_config_info"] == 1.0
    assert not any(k.endswith(("_bucket", "_created")) for k in m)
    assert set(DEFAULT_NAMES) <= set(m)


def test_parse_metrics_empty_and_nan() -> None:
    assert parse_metrics("") == {}
    assert parse_metrics('# TYPE g gauge\ng NaN\ng{a="1"} 2\n') == {"g": 2.0}


def metrics_text(k: int) -> str:
    """A /metrics page at scrape ``k``: counters grow, gauges move."""
    return (
        METRICS.replace(
            'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0',
            f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {3 + 2 * k}.0',
        )
        .replace(
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 12800.0',
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {12800 + 100 * k}.0',
        )
        .replace(
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 3200.0',
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {3200 + 25 * k}.0',
        )
        .replace(  # speculative decoding: 4 draft tokens a scrape, 1.5 of them accepted
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 400.0',
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {400 + 4 * k}.0',
        )
        .replace(
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150.0',
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} '
            f"{150 + 1.5 * k}",
        )
        .replace(
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4375',
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {(k % 4) / 4}',
        )
    )


class MetricsServer:
    def __init__(self) -> None:
        self.calls = 0
        self.fail_on: set[int] = set()

    async def handle(self, request: web.Request) -> web.Response:
        k = self.calls
        self.calls += 1
        if k in self.fail_on:
            return web.Response(status=500, text="oops")
        return web.Response(text=metrics_text(k), content_type="text/plain")


@pytest.fixture
async def metrics_server(
    serve_app: Callable[[web.Application], AbstractAsyncContextManager[str]],
) -> AsyncIterator[tuple[str, MetricsServer]]:
    ms = MetricsServer()
    app = web.Application()
    app.router.add_get("/metrics", ms.handle)
    async with serve_app(app) as base:
        yield base, ms


async def wait_calls(ms: MetricsServer, n: int) -> None:
    for _ in range(2000):
        if ms.calls >= n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"only {ms.calls} scrapes")


async def test_scraper_time_series_and_summary(
    metrics_server: tuple[str, MetricsServer],
) -> None:
    base, ms = metrics_server
    ms.fail_on = {2}
    async with MetricsScraper(base + "/", interval_s=0.02) as s:
        await wait_calls(ms, 6)
    assert s.errors == 1
    assert s.last_error is not None
    assert ms.calls - 2 <= len(s.samples) <= ms.calls - 1  # a scrape cut off at exit is lost
    ts = [x["t_s"] for x in s.samples]
    assert ts == sorted(ts)
    assert all(set(x) == {"t_s", *DEFAULT_NAMES} for x in s.samples)
    first, last = s.samples[0], s.samples[-1]
    assert first["vllm:num_preemptions_total"] == 3.0  # the entry scrape is the baseline
    summ = s.summary()
    assert summ["preemptions"] == last["vllm:num_preemptions_total"] - 3.0
    assert summ["preemptions"] >= 2 * 4  # at least scrapes 0..5 minus one: counters grew
    assert summ["prefix_cache_hit_rate"] == pytest.approx(0.25)
    assert summ["spec_decode_acceptance"] == pytest.approx(1.5 / 4)  # the deltas', not totals
    assert (
        summ["spec_decode_draft_tokens"]
        == last["vllm:spec_decode_num_draft_tokens_total"]
        - (first["vllm:spec_decode_num_draft_tokens_total"])
    )
    kv = [x["vllm:kv_cache_usage_perc"] for x in s.samples]
    assert summ["kv_cache_usage_max"] == max(kv) == 0.75
    assert summ["kv_cache_usage_mean"] == pytest.approx(sum(kv) / len(kv))
    assert summ["running_max"] == 12.0
    assert summ["waiting_max"] == 2.0
    assert summ["scrape_errors"] == 1.0


def lag_max_text(seconds: float) -> str:
    """The simulator's ``tuner_sim:stream_lag_max_seconds`` as its ``/metrics`` shows it."""
    return (
        "# TYPE tuner_sim:stream_lag_max_seconds gauge\n"
        f'tuner_sim:stream_lag_max_seconds{{engine="0"}} {seconds}\n'
    )


def metrics_app(handle: Callable[[web.Request], Awaitable[web.Response]]) -> web.Application:
    """A server whose ``/metrics`` is ``handle``."""
    app = web.Application()
    app.router.add_get("/metrics", handle)
    return app


async def test_scraper_summary_has_the_simulators_lag(
    serve_app: Callable[[web.Application], AbstractAsyncContextManager[str]],
) -> None:
    # tuner_sim:stream_lag_seconds (tuner/sim/runtime.py): 2 s over 400 chunks between the
    # first and last scrape: 5 ms late on average
    calls = 0

    async def handle(_: web.Request) -> web.Response:
        nonlocal calls
        k = min(calls, 1)
        calls += 1
        lag = (
            "# TYPE tuner_sim:stream_lag_seconds histogram\n"
            f'tuner_sim:stream_lag_seconds_bucket{{engine="0",le="+Inf"}} {100 + 400 * k}.0\n'
            f'tuner_sim:stream_lag_seconds_count{{engine="0"}} {100 + 400 * k}.0\n'
            f'tuner_sim:stream_lag_seconds_sum{{engine="0"}} {0.5 + 2.0 * k}\n'
            # the latest chunk since the previous read: 3 s before the replay (not its), 0.25 s in it
            + lag_max_text(3.0 if k == 0 else 0.25)
        )
        return web.Response(text=METRICS + lag, content_type="text/plain")

    app = metrics_app(handle)
    async with serve_app(app) as base, MetricsScraper(base, interval_s=10.0) as s:
        pass
    assert s.summary()["sim_lag_mean_ms"] == pytest.approx(5.0)
    assert s.summary()["sim_lag_max_ms"] == pytest.approx(250.0)  # the first read is not its
    calls = 0  # the vLLM series only (vLLM has no such histogram): no key
    async with serve_app(app) as base, MetricsScraper(base, 10.0, names=DEFAULT_NAMES) as s:
        pass
    assert "sim_lag_mean_ms" not in s.summary() and "sim_lag_max_ms" not in s.summary()


async def test_a_read_in_flight_at_exit_is_finished_not_cancelled(
    serve_app: Callable[[web.Application], AbstractAsyncContextManager[str]],
) -> None:
    # the simulator's tuner_sim:stream_lag_max_seconds is reset by every read: the periodic read
    # in flight when the replay ends carries the 1 s stall, and the exit read finds 0 (a
    # fresh-clone CI run, 2026-12-06: cancelled, that read took the stall along)
    calls = 0
    in_flight = asyncio.Event()

    async def handle(_: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        lag = 0.0
        if calls == 2:  # the periodic read, answered late (the host stalled), with the stall
            in_flight.set()
            await asyncio.sleep(0.3)
            lag = 1.0
        return web.Response(text=METRICS + lag_max_text(lag), content_type="text/plain")

    async with serve_app(metrics_app(handle)) as base, MetricsScraper(base, interval_s=0.05) as s:
        await in_flight.wait()
    assert calls == 3  # entry, the periodic read, exit
    assert s.series("tuner_sim:stream_lag_max_seconds") == [0.0, 1.0, 0.0]
    assert s.peak_within("tuner_sim:stream_lag_max_seconds", 0.0, time.perf_counter()) == 1.0


async def test_scraper_with_session(metrics_server: tuple[str, MetricsServer]) -> None:
    base, ms = metrics_server
    async with aiohttp.ClientSession(base_url=base) as session:
        async with MetricsScraper(session, interval_s=0.02, names=["vllm:num_requests_running"]):
            await wait_calls(ms, 2)
        assert not session.closed  # a borrowed session is left open


async def test_scraper_unreachable_never_raises() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with MetricsScraper(f"http://127.0.0.1:{port}", interval_s=0.01) as s:
        for _ in range(1000):
            if s.errors >= 3:
                break
            await asyncio.sleep(0.005)
    assert s.errors >= 3
    assert s.samples == []
    assert s.summary() == {"scrape_errors": float(s.errors)}


# --- GPU -----------------------------------------------------------------------------------


@pytest.fixture
def fresh_nvml() -> Iterator[None]:
    gpu._reset()
    yield
    gpu._reset()


def test_no_nvml_is_noop(fresh_nvml: None) -> None:
    if gpu.nvml_available():
        pytest.skip("a GPU driver is present")
    assert gpu.nvml_available() is False
    assert gpu.gpu_memory([0]) == []
    assert gpu.wait_for_free_memory([0], 1e9, timeout_s=100.0) == (True, [])
    with gpu.GpuSampler([0], 0.01) as s:
        assert not s.active
    assert s.samples == []
    assert s.summary() == {}


class FakeNVMLError(Exception):
    pass


RESERVED = 1 << 29  # 0.5 GiB the driver reserves on an idle GPU
V2 = 0x2000028  # pynvml.nvmlMemory_v2


def fake_pynvml(free_after: int = 0, fail_index: int | None = None) -> Any:
    """A stand-in pynvml: 80 GiB GPUs whose free memory grows after ``free_after`` reads."""
    reads = {"n": 0}
    gib = 1 << 30

    def handle(i: int) -> int:
        if i == fail_index:
            raise FakeNVMLError("Invalid Argument")
        return i

    def mem(h: int, version: int | None = None) -> Any:
        # v2 (nvidia-smi's figures): used leaves out the driver's reserve; v1 counts it as used
        reads["n"] += 1
        used = 70 * gib if reads["n"] <= free_after else 10 * gib
        free = 80 * gib - used - RESERVED
        if version == V2:
            return types.SimpleNamespace(used=used, free=free, total=80 * gib, reserved=RESERVED)
        return types.SimpleNamespace(used=used + RESERVED, free=free, total=80 * gib)

    return types.SimpleNamespace(
        NVMLError=FakeNVMLError,
        nvmlMemory_v2=V2,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetMemoryInfo=mem,
        nvmlDeviceGetName=lambda h: "NVIDIA A100-SXM4-80GB",
        nvmlDeviceGetUUID=lambda h: f"GPU-0000000{h}-feed",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=50 + 10 * h),
        nvmlDeviceGetPowerUsage=lambda h: 300_000,
    )


def test_fake_nvml_memory_and_wait(monkeypatch: pytest.MonkeyPatch, fresh_nvml: None) -> None:
    monkeypatch.setattr(gpu, "pynvml", fake_pynvml(free_after=2))
    assert gpu.nvml_available()
    (m,) = gpu.gpu_memory([0])
    # used as nvidia-smi shows it (v2: without the 0.5 GiB reserve; it once said 0.60 GiB used
    # before launch on an idle H200 where nvidia-smi said 0 MiB)
    assert (m.index, m.used_gib, m.free_gib, m.total_gib) == (0, 70.0, 9.5, 80.0)
    assert m.name == "NVIDIA A100-SXM4-80GB"
    assert m.uuid == "GPU-00000000-feed"  # which card: the lever screen's machine
    assert gpu.machine_of(gpu.gpu_memory([1, 0])) == "GPU-00000001-feed,GPU-00000000-feed"
    assert gpu.machine_of([gpu.GpuMemory(0, 0.0, 1.0, 1.0)]) is None  # no UUID: not known
    ok, mem = gpu.wait_for_free_memory([0], need_gib=40.0, timeout_s=30.0, poll_s=0.001)
    assert ok
    assert mem[0].free_gib == 69.5
    ok, mem = gpu.wait_for_free_memory([0], need_gib=75.0, timeout_s=0.0, poll_s=0.001)
    assert not ok
    assert mem[0].free_gib == 69.5


def test_a_driver_without_v2_gives_v1(monkeypatch: pytest.MonkeyPatch, fresh_nvml: None) -> None:
    fake = fake_pynvml()
    v1 = fake.nvmlDeviceGetMemoryInfo

    def no_v2(h: int, version: int | None = None) -> Any:
        if version is not None:
            raise FakeNVMLError("Function Not Found")
        return v1(h)

    fake.nvmlDeviceGetMemoryInfo = no_v2
    monkeypatch.setattr(gpu, "pynvml", fake)
    (m,) = gpu.gpu_memory([0])
    assert (m.used_gib, m.free_gib) == (10.5, 69.5)


def test_fake_nvml_error_translated(monkeypatch: pytest.MonkeyPatch, fresh_nvml: None) -> None:
    monkeypatch.setattr(gpu, "pynvml", fake_pynvml(fail_index=3))
    with pytest.raises(EngineError, match="Invalid Argument"):
        gpu.gpu_memory([0, 3])
    s = gpu.GpuSampler([3], 0.01).start()  # never raises
    assert not s.active
    assert s.errors == 1


def test_fake_nvml_init_failure(monkeypatch: pytest.MonkeyPatch, fresh_nvml: None) -> None:
    fake = fake_pynvml()

    def boom() -> None:
        raise FakeNVMLError("Driver Not Loaded")

    fake.nvmlInit = boom
    monkeypatch.setattr(gpu, "pynvml", fake)
    assert gpu.nvml_available() is False
    assert "Driver Not Loaded" in (gpu.nvml_error() or "")


def test_fake_nvml_sampler(monkeypatch: pytest.MonkeyPatch, fresh_nvml: None) -> None:
    monkeypatch.setattr(gpu, "pynvml", fake_pynvml(free_after=1))
    with gpu.GpuSampler([0, 1], 0.005) as s:
        assert s.active
        for _ in range(2000):
            if len(s.samples) >= 6:
                break
            time.sleep(0.002)
    assert not s.active
    assert {x["gpu"] for x in s.samples} == {0.0, 1.0}
    summ = s.summary()
    assert summ["gpu_mem_used_peak_gib"] == 70.0
    assert summ["gpu_power_mean_w"] == 300.0
    assert 50.0 <= summ["gpu_util_mean"] <= 60.0


def test_wait_for_used_memory(monkeypatch: pytest.MonkeyPatch, fresh_nvml: None) -> None:
    monkeypatch.setattr(gpu, "pynvml", fake_pynvml(free_after=2))  # 70 GiB used, then 10
    ok, mem = gpu.wait_for_used_memory({0: 11.0}, timeout_s=30.0, poll_s=0.001)
    assert ok and mem[0].used_gib == 10.0
    ok, mem = gpu.wait_for_used_memory({0: 5.0}, timeout_s=0.0)
    assert not ok and mem[0].used_gib == 10.0


async def test_the_simulator_reads_no_gpu_memory_after_its_server(
    make_cfg, monkeypatch: pytest.MonkeyPatch, fresh_nvml: None
) -> None:
    asked: list[str] = []

    class Recording:
        def __getattr__(self, name: str) -> Any:
            asked.append(name)
            raise FakeNVMLError(name)

    monkeypatch.setattr(gpu, "pynvml", Recording())
    before = [gpu.GpuMemory(0, 0.0, 140.0, 140.0)]
    server = types.SimpleNamespace(proc=types.SimpleNamespace(pid=1))
    cfg = make_cfg("+workload=chat")
    assert await gpu_freed(cfg.engine, before, server) == {}  # type: ignore[arg-type]
    assert asked == []
