"""The parts of ``benchmarks/replay_vs_vllm_bench.py`` that explain a gap between the clients:
the tuner's idle time per closed-loop slot (``client_gaps``) and the server's running / waiting
requests sampled by a child process (``server_queue``)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tuner.records import RequestRecord

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rvb() -> Any:
    name = "replay_vs_vllm_bench"
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


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
