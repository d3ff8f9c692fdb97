"""tuner.replay against a tiny aiohttp server that streams SSE like vLLM (``tests/helpers/fake_vllm.py``)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from helpers.fake_vllm import FakeVLLM, run, spec

from tuner.config import ArrivalConfig
from tuner.records import RequestRecord


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_ttft_itl_usage(server: tuple[str, FakeVLLM], endpoint: str) -> None:
    base, fake = server
    s = spec(0, endpoint=endpoint, max_tokens=5, x_ttft=0.05, x_itl=0.02)
    (rec,) = await run(base, [s])
    assert rec.status == "ok", rec.error
    assert rec.http_status == 200
    assert rec.prompt_tokens == 11
    assert rec.output_tokens == 5
    assert rec.ttft_s is not None
    assert rec.ttft_s >= 0.05
    assert len(rec.itl_s) == 4  # 5 content chunks; role-only and empty final chunks don't count
    assert all(g >= 0.02 for g in rec.itl_s)
    assert rec.e2e_s is not None
    assert rec.e2e_s >= rec.ttft_s + sum(rec.itl_s) - 1e-9
    assert rec.tpot_s is not None
    assert rec.tpot_s > 0
    ((_, body, headers),) = fake.received
    assert body["model"] == "m"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True
    assert "Authorization" not in headers


async def test_bearer_auth_and_on_record(server: tuple[str, FakeVLLM]) -> None:
    base, fake = server
    seen: list[RequestRecord] = []
    recs = await run(base, [spec(i) for i in range(3)], api_key="sekret", on_record=seen.append)
    assert sorted(r.index for r in seen) == [0, 1, 2]
    assert [r.index for r in recs] == [0, 1, 2]
    assert all(h["Authorization"] == "Bearer sekret" for _, _, h in fake.received)


async def test_closed_loop_concurrency_bound(server: tuple[str, FakeVLLM]) -> None:
    base, fake = server
    specs = [spec(i, max_tokens=3, x_ttft=0.03, x_itl=0.005) for i in range(24)]
    recs = await run(base, specs, ArrivalConfig(kind="concurrency", concurrency=3))
    assert len(recs) == 24
    assert all(r.status == "ok" for r in recs)
    assert fake.max_in_flight <= 3
    assert fake.max_in_flight >= 2  # it does overlap


async def test_connections_are_kept_alive(server: tuple[str, FakeVLLM]) -> None:
    """Each stream is read to its end, so its connection goes back to the pool: a closed loop
    opens about as many connections as it keeps requests in flight, as ``vllm bench serve``
    does, not one per request (each new connection costs the server's API process work)."""
    base, fake = server
    specs = [spec(i, max_tokens=3, x_ttft=0.01, x_tail=0.005) for i in range(30)]
    recs = await run(base, specs, ArrivalConfig(kind="concurrency", concurrency=3))
    assert all(r.status == "ok" for r in recs)
    assert len(fake.peers) == 30
    assert len(set(fake.peers)) <= 3, f"{len(set(fake.peers))} connections for 30 requests"


async def test_open_loop_respects_arrivals(server: tuple[str, FakeVLLM]) -> None:
    base, fake = server
    arrivals = [0.0, 0.15, 0.3, 0.45]
    specs = [spec(i, arrival_s=a) for i, a in enumerate(arrivals)]
    recs = await run(base, specs, ArrivalConfig(kind="poisson", rate=10.0))
    assert [r.status for r in recs] == ["ok"] * 4
    for r, a in zip(recs, arrivals, strict=True):
        assert r.t_sent_s >= a - 1e-3
    received = [t for t, _, _ in fake.received]
    assert received == sorted(received)
    assert received[-1] - received[0] >= 0.45 - 0.05  # spread out, not sent at once


async def test_open_loop_max_concurrency(server: tuple[str, FakeVLLM]) -> None:
    base, fake = server
    specs = [spec(i, arrival_s=0.0, x_ttft=0.05) for i in range(8)]
    arrival = ArrivalConfig(kind="constant", rate=100.0, max_concurrency=2)
    recs = await run(base, specs, arrival)
    assert len(recs) == 8
    assert fake.max_in_flight <= 2


async def test_warmup_first_and_flagged(server: tuple[str, FakeVLLM]) -> None:
    base, fake = server
    w = {"x_ttft": 0.02}
    specs = [spec(0, warmup=True, x_tag="w0", **w), spec(1, warmup=True, x_tag="w1", **w)]
    specs += [spec(2 + i, arrival_s=0.0, x_tag=f"m{i}") for i in range(2)]
    recs = await run(base, specs, ArrivalConfig(kind="poisson", rate=1.0))
    assert [(r.index, r.warmup) for r in recs] == [(0, True), (1, True), (2, False), (3, False)]
    tags = [b["x_tag"] for _, b, _ in fake.received]
    assert set(tags[:2]) == {"w0", "w1"}
    assert fake.in_flight_at_receipt[:2] == [1, 1]  # warm-ups one by one for open loop


async def test_duration_bound_stops_new_sends(server: tuple[str, FakeVLLM]) -> None:
    base, fake = server
    specs = [spec(i, x_ttft=0.1) for i in range(50)]
    recs = await run(base, specs, ArrivalConfig(kind="concurrency", concurrency=1), duration_s=0.35)
    assert 1 <= len(recs) < 50
    assert len(fake.received) == len(recs)  # unsent requests produce no record
    assert all(r.t_sent_s < 0.35 for r in recs)
    assert all(r.status == "ok" for r in recs)  # the one in flight at the deadline finished


async def test_duration_bound_open_loop(server: tuple[str, FakeVLLM]) -> None:
    base, _ = server
    specs = [spec(i, arrival_s=i * 0.1) for i in range(20)]
    recs = await run(base, specs, ArrivalConfig(kind="constant", rate=10.0), duration_s=0.25)
    assert [r.index for r in recs] == [0, 1, 2]


async def test_http_500_is_error_record(server: tuple[str, FakeVLLM]) -> None:
    base, _ = server
    recs = await run(base, [spec(0, x_mode="http500"), spec(1, x_mode="http400_text"), spec(2)])
    assert [r.status for r in recs] == ["error", "error", "ok"]
    assert recs[0].http_status == 500
    assert recs[0].error == "boom: engine dead"
    assert recs[1].http_status == 400
    assert recs[1].error == "bad request text"


async def test_midstream_error_chunk(server: tuple[str, FakeVLLM]) -> None:
    base, _ = server
    (rec,) = await run(base, [spec(0, endpoint="chat", x_mode="midstream_error", max_tokens=6)])
    assert rec.status == "error"
    assert rec.error == "mid-stream failure"
    assert rec.ttft_s is not None  # partial timing is kept


async def test_timeout_record(server: tuple[str, FakeVLLM]) -> None:
    base, _ = server
    (rec,) = await run(base, [spec(0, x_mode="hang")], request_timeout_s=0.3)
    assert rec.status == "timeout"
    assert rec.e2e_s is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_connection_refused_is_error() -> None:
    base = f"http://127.0.0.1:{free_port()}"
    recs = await run(base, [spec(0), spec(1)], request_timeout_s=5.0)
    assert [r.status for r in recs] == ["error", "error"]
    assert all(r.error and "Connect" in r.error for r in recs)
    assert all(r.http_status is None for r in recs)


async def test_specs_with_arrivals_replay_open_loop(server: tuple[str, FakeVLLM]) -> None:
    """A trace's specs carry send times: they are honoured even if arrival.kind is closed loop."""
    base, fake = server
    arrivals = [0.0, 0.2, 0.4]
    specs = [spec(i, arrival_s=a) for i, a in enumerate(arrivals)]
    starts: list[float] = []
    recs = await run(
        base, specs, ArrivalConfig(kind="concurrency", concurrency=8), on_start=starts.append
    )
    assert [r.status for r in recs] == ["ok"] * 3
    for r, a in zip(recs, arrivals, strict=True):
        assert r.t_sent_s >= a - 1e-3
    received = [t for t, _, _ in fake.received]
    assert received[-1] - received[0] >= 0.4 - 0.05
    (t0,) = starts
    assert received[0] >= t0  # records are relative to the start on_start reported


async def test_trace_max_concurrency_caps_in_flight(server: tuple[str, FakeVLLM]) -> None:
    base, fake = server
    specs = [spec(i, arrival_s=0.0, x_ttft=0.05) for i in range(6)]
    arrival = ArrivalConfig(kind="concurrency", concurrency=64, max_concurrency=2)
    recs = await run(base, specs, arrival)
    assert [r.status for r in recs] == ["ok"] * 6
    assert fake.max_in_flight == 2
    assert sorted(r.t_sent_s for r in recs)[-1] >= 0.1  # the last ones waited for a slot


async def test_lines_split_across_reads(unused_tcp_port: int) -> None:
    """SSE lines cut anywhere by the network, CRLF endings, and a last line without newline."""
    chunks = [
        b'data: {"choices": [{"index": 0, "text": " a"}]}\r\n\r\ndata: {"choi',
        b'ces": [{"index": 0, "text": " b"}]}\n',
        b'\ndata: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}\n\n',
        b"data: [DONE]",
    ]

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for c in chunks:
            await resp.write(c)
            await asyncio.sleep(0.02)
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    srv = TestServer(app, host="127.0.0.1", port=unused_tcp_port)
    await srv.start_server()
    try:
        (rec,) = await run(str(srv.make_url("")).rstrip("/"), [spec(0)])
    finally:
        await srv.close()
    assert rec.status == "ok", rec.error
    assert rec.output_tokens == 2
    assert rec.prompt_tokens == 3
    assert len(rec.itl_s) == 1
    assert rec.itl_s[0] >= 0.015  # " b" completed in the read after " a"


async def test_malformed_line_is_error_record(unused_tcp_port: int) -> None:
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"text": " a"}]} trailing\n\n')
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    srv = TestServer(app, host="127.0.0.1", port=unused_tcp_port)
    await srv.start_server()
    try:
        (rec,) = await run(str(srv.make_url("")).rstrip("/"), [spec(0)])
    finally:
        await srv.close()
    assert rec.status == "error"
    assert rec.error is not None
    assert rec.error.startswith("malformed SSE data: b'data: {")
