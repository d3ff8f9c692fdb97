"""The parts of ``benchmarks/replay_vs_vllm_bench.py`` that explain a gap between the clients:
the tuner's idle time per closed-loop slot (``client_gaps``) and the server's running / waiting
requests sampled by a child process (``server_queue``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from helpers.benchmarks import load_benchmark

from tuner.records import RequestRecord


@pytest.fixture(scope="module")
def rvb() -> Any:
    return load_benchmark("replay_vs_vllm_bench")


def _scrapers(out: Path) -> list[int]:
    """Live processes whose command line names ``out`` (Linux /proc)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().split(") ")[-1][:1]
        except OSError:
            continue
        if str(out).encode() in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


def _rec(index: int, sent: float, e2e: float) -> RequestRecord:
    return RequestRecord(index=index, status="ok", t_sent_s=sent, ttft_s=0.01, e2e_s=e2e)


def test_client_gaps(rvb: Any) -> None:
    # closed loop of 2 slots, t0 = 100: requests 0 and 1 start at once, 2 and 3 take their slots
    t0 = 100.0
    records = [_rec(0, 0.0, 1.0), _rec(1, 0.0, 2.0), _rec(2, 1.003, 1.0), _rec(3, 2.004, 1.0)]
    # the client finished reading each stream 1 ms (request 0: 2 ms) after its last token
    done_at = {0: t0 + 1.002, 1: t0 + 2.001, 2: t0 + 2.004, 3: t0 + 3.005}
    got = rvb.client_gaps(records, done_at, t0, concurrency=2)
    assert got["stream_end_max_ms"] == pytest.approx(2.0, abs=1e-6)
    assert got["stream_end_p50_ms"] == pytest.approx(1.0, abs=1e-6)
    # sends after the first two: 101.003 and 102.004; slots freed at 101.002 and 102.001
    assert got["next_send_p50_ms"] == pytest.approx(2.0, abs=1e-6)
    assert got["next_send_max_ms"] == pytest.approx(3.0, abs=1e-6)
    assert rvb.client_gaps([], {}, t0, concurrency=2) == {}


async def test_server_queue_samples_running_requests(rvb: Any, tmp_path: Path) -> None:
    # a /metrics that reports 0 running, then 8 for a while (a run), then 0 again
    state = {"running": 0.0, "waiting": 0.0}

    async def metrics(_: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} {state["running"]}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="m"}} {state["waiting"]}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with rvb.server_queue(
            f"http://127.0.0.1:{port}", tmp_path / "q.json", concurrency=8
        ) as stats:
            assert _scrapers(tmp_path / "q.json")  # sampling from a child process
            state.update(running=8.0, waiting=2.0)
            await asyncio.sleep(2.5)
            state.update(running=0.0, waiting=0.0)
            await asyncio.sleep(0.6)
        assert stats["server_running_mean"] == pytest.approx(8.0)
        assert stats["server_running_full_share"] == pytest.approx(1.0)
        assert stats["server_waiting_mean"] == pytest.approx(2.0)
        assert stats["server_queue_samples"] >= 4
        assert not _scrapers(tmp_path / "q.json")  # the child process has exited
    finally:
        await runner.cleanup()


# --- open loop: vllm's schedule, the send lag, loads, pooling ----------------------------------


def _vllm_get_request_times(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """vLLM 0.24's ``benchmarks/serve.py:get_request`` delays, as it computes them after
    ``np.random.seed(seed)`` in ``main`` (its loop written out, not our vectorised version)."""
    import numpy as np

    np.random.seed(seed)
    delay_ts: list[float] = []
    for _ in range(n):
        if burstiness == float("inf"):
            delay_ts.append(1.0 / rate)
        else:
            theta = 1.0 / (rate * burstiness)
            delay_ts.append(np.random.gamma(shape=burstiness, scale=theta))
    for i in range(1, len(delay_ts)):
        delay_ts[i] += delay_ts[i - 1]
    factor = (n / rate) / delay_ts[-1]
    return [d * factor for d in delay_ts]


@pytest.mark.parametrize("burstiness", [float("inf"), 1.0, 0.5, 4.0])
def test_vllm_schedule_matches_vllm_get_request(rvb: Any, burstiness: float) -> None:
    got = rvb.vllm_schedule(200, 24.0, burstiness, seed=3)
    want = _vllm_get_request_times(200, 24.0, burstiness, seed=3)
    assert got == pytest.approx(want, rel=1e-12)
    assert got[-1] == pytest.approx(200 / 24.0)
    assert all(b > a for a, b in zip(got, got[1:], strict=False))
    if burstiness == float("inf"):
        assert got[0] == pytest.approx(1 / 24.0) and got[1] - got[0] == pytest.approx(1 / 24.0)
    else:  # seeded: another seed gives other times
        assert rvb.vllm_schedule(200, 24.0, burstiness, seed=4) != got
    with pytest.raises(ValueError, match="must be > 0"):
        rvb.vllm_schedule(10, 0.0, burstiness, seed=0)


def test_send_lags(rvb: Any) -> None:
    schedule = [0.1, 0.2, 0.3, 0.4]
    # the client's clock starts elsewhere (+100 s); request 2 went out 2 ms late
    sent = [100.0, 100.1, 100.202, 100.3]
    got = rvb.send_lags(sent, schedule)
    assert got["send_lag_max_ms"] == pytest.approx(2.0, abs=1e-6)
    assert got["send_lag_p50_ms"] == pytest.approx(0.0, abs=1e-6)
    assert got["send_lag_mean_ms"] == pytest.approx(0.5, abs=1e-3)
    assert rvb.send_lags([], schedule) == {} and rvb.send_lags(sent[:3], schedule) == {}


def test_load_labels(rvb: Any) -> None:
    assert rvb.Load(concurrency=64).label == "c64"
    assert rvb.Load(rate=24.0).label == "r24"
    assert rvb.Load(rate=24.0, burstiness=1.0).label == "r24-b1"
    assert rvb.Load(rate=2.5, burstiness=0.5).label == "r2.5-b0.5"
    with pytest.raises(ValueError):
        rvb.Load()
    with pytest.raises(ValueError):
        rvb.Load(concurrency=4, rate=2.0)
    # from saved rows: JSON holds constant gaps as "inf"; rows from before open loops: no rate
    assert rvb._load_of({"concurrency": None, "rate": 24.0, "burstiness": "inf"}) == "r24"
    assert rvb._load_of({"concurrency": None, "rate": 24.0, "burstiness": 1.0}) == "r24-b1"
    assert rvb._load_of({"concurrency": 64}) == "c64"


def test_vllm_argv_open_and_closed_loop(rvb: Any, tmp_path: Path) -> None:
    def argv(load: Any) -> list[str]:
        return list(
            rvb.vllm_argv(
                "vllm", "http://h", "m", tmp_path, tmp_path / "d.json", 10, None, load, 1,
                tmp_path / "r.json", 7,
            )
        )  # fmt: skip

    def flag(a: list[str], name: str) -> str | None:
        return a[a.index(name) + 1] if name in a else None

    closed = argv(rvb.Load(concurrency=8))
    assert flag(closed, "--request-rate") == "inf" and flag(closed, "--max-concurrency") == "8"
    assert flag(closed, "--seed") == "7"
    open_ = argv(rvb.Load(rate=24.0, burstiness=1.0))
    assert flag(open_, "--request-rate") == "24.0" and flag(open_, "--burstiness") == "1.0"
    assert "--max-concurrency" not in open_
    assert float(flag(argv(rvb.Load(rate=24.0)), "--burstiness") or 0) == float("inf")


def _run(rep: int, client: str, tok_s: float, ttft: float, **kw: Any) -> dict[str, Any]:
    return {
        "concurrency": None, "rate": 24.0, "burstiness": "inf", "rep": rep, "client": client,
        "completed": 10, "failed": 0, "output_throughput": tok_s, "ttft_p50_ms": ttft,
        "tpot_p50_ms": 7.0, **kw,
    }  # fmt: skip


def test_combine_pools_pairs_per_load_and_file(rvb: Any, tmp_path: Path) -> None:
    import json

    def write(name: str, runs: list[dict[str, Any]], same: bool) -> Path:
        path = tmp_path / name
        summary = [{"concurrency": None, "rate": 24.0, "burstiness": "inf",
                    "identical_token_counts": same}]  # fmt: skip
        path.write_text(json.dumps({"runs": runs, "summary": summary}))
        return path

    a = write(
        "a.json",
        [
            _run(0, "ours", 102, 30),
            _run(0, "vllm", 100, 30),
            _run(1, "vllm", 100, 40),
            _run(1, "ours", 100, 44),
            _run(2, "ours", 100, 1),
        ],
        same=True,
    )  # fmt: skip  (rep 2: no pair)
    b = write("b.json", [_run(0, "ours", 99, 33), _run(0, "vllm", 100, 30)], same=True)
    pooled = rvb.combine([a, b], 0.03)
    (s,) = pooled["summary"]
    assert s["load"] == "r24" and s["pairs"] == 3
    assert sorted({r["rep"] for r in pooled["runs"]}) == [0, 1, 2]  # b's rep 0 became rep 2
    tok = s["ratios"]["output_throughput"]
    assert tok["per_pair"] == pytest.approx([1.02, 1.0, 0.99])
    assert tok["mean"] == pytest.approx(1.0033333, abs=1e-6) and tok["sem"] > 0
    assert s["ratios"]["ttft_p50_ms"]["mean"] == pytest.approx((1.0 + 1.1 + 1.1) / 3)
    assert s["identical_token_counts"] is True and s["within_tolerance"]["output_throughput"]
    assert s["holds"] is False  # TTFT p50 is 6.7 % over
    c = write("c.json", [_run(0, "ours", 100, 30), _run(0, "vllm", 100, 30)], same=False)
    assert rvb.combine([a, c], 0.03)["summary"][0]["identical_token_counts"] is False
