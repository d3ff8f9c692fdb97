"""How much latency the replay client (:mod:`tuner.replay`) adds, and how many requests/s it
sustains on one core.

Setup: a zero-delay streaming server (aiohttp, in its own process, pinned to core 1 when the
machine has one; the client is pinned to core 0) answers ``POST /v1/chat/completions`` with a
role chunk, ``--tokens`` content chunks, a finish chunk, a usage chunk and ``[DONE]`` in vLLM's
OpenAI chunk format, immediately. Every chunk carries ``ts`` (``time.time()``) and ``mono``
(``time.perf_counter()``, CLOCK_MONOTONIC, which is system-wide on Linux) of the moment the
server wrote it, and the server keeps the first content chunk's ``mono`` per request id.

* **Added latency** of request i = the client's receive time of its first content chunk
  (``t0 + t_sent_s + ttft_s``, ``t0`` from ``replay(on_start=...)``) minus the server's stamp of
  that chunk: socket delivery plus the time the client's event loop took to get to it.
  Scenarios: 100 and 1,000 streams closed loop against the zero-delay server (saturated: the
  client never waits, so this is mostly queueing behind other streams' chunks, and ``req/s`` is
  the client's saturated throughput); 100 and 1,000 streams *paced* (open loop, arrivals spread
  so that about that many streams are open; the server emits one chunk per stream every
  ``TICK_S`` engine step, all streams in the same step, as vLLM does); and open loop at half the
  client's capacity.
* **Capacity**: open loop at constant rates on a rising ladder, ``--step-s`` seconds each; a
  rate is sustained when every request succeeds, completions keep up (>= 95 % of the rate) and
  p99 send lateness (``t_sent_s - arrival_s``) is <= 50 ms. The highest sustained rate is
  reported (the ladder stops after two failures in a row).

Both are measured for the current client (``tuner.replay``) and, side by side in the same run,
for the client as it was before the per-chunk loop was optimised (``baseline``: the previous
``_Runner._stream``, kept below verbatim), so the ratio is not confounded by the machine.

``python benchmarks/client_capacity.py [--tokens N] [--quick] [--out PATH]``; prints a table and
writes ``benchmarks/results/client_capacity.json``. About 2 minutes (``--quick``: ~20 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import resource
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable as a plain script from anywhere
    sys.path.insert(0, str(ROOT))

import tuner.replay as replay_mod  # noqa: E402
from tuner.config import ArrivalConfig  # noqa: E402
from tuner.records import RequestRecord, RequestSpec  # noqa: E402
from tuner.replay import replay  # noqa: E402

TICK_S = 0.05
"""Paced scenarios: the server's engine step (one token for every open stream per step)."""
SEND_LAG_LIMIT_S = 0.050
THROUGHPUT_SHARE = 0.95


# --- the zero-delay server (child process) -----------------------------------------------------


def _pin(core: int | None) -> None:
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _server_main(port: int, core: int | None, ready: Any) -> None:
    from aiohttp import web

    _pin(core)
    _raise_nofile()
    first_chunk: dict[int, float] = {}
    head = b'data: {"id":"chatcmpl-%d","object":"chat.completion.chunk","created":%d,"model":"m",'
    role = head + (
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
        b'"finish_reason":null}],"ts":%.6f,"mono":%.9f}\n\n'
    )
    content = head + (
        b'"choices":[{"index":0,"delta":{"content":" tok%d"},"logprobs":null,'
        b'"finish_reason":null}],"ts":%.6f,"mono":%.9f}\n\n'
    )
    final = head + (
        b'"choices":[{"index":0,"delta":{"content":""},"logprobs":null,'
        b'"finish_reason":"length","stop_reason":null}],"ts":%.6f,"mono":%.9f}\n\n'
    )
    usage = head + (
        b'"choices":[],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d},'
        b'"ts":%.6f,"mono":%.9f}\n\n'
    )

    loop_state: dict[str, Any] = {}

    async def ticker() -> None:
        """Engine steps: every ``TICK_S`` one future fires for all paced streams at once."""
        loop = asyncio.get_running_loop()
        loop_state["tick"] = loop.create_future()
        while True:
            await asyncio.sleep(TICK_S)
            fired, loop_state["tick"] = loop_state["tick"], loop.create_future()
            fired.set_result(None)

    async def paced(request: web.Request, rid: int, n: int) -> web.StreamResponse:
        """One chunk per engine step, written as each is made (as vLLM streams a batch)."""
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        created = int(time.time())
        await resp.write(role % (rid, created, time.time(), time.perf_counter()))
        for i in range(n):
            await loop_state["tick"]
            mono = time.perf_counter()
            if i == 0:
                first_chunk[rid] = mono
            await resp.write(content % (rid, created, i, time.time(), mono))
        now = time.perf_counter()
        await resp.write(
            final % (rid, created, time.time(), now)
            + usage % (rid, created, 16, 16 + n, n, time.time(), now)
            + b"data: [DONE]\n\n"
        )
        await resp.write_eof()
        return resp

    async def chat(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        rid, n = int(body["x_id"]), int(body["max_tokens"])
        if body.get("x_paced"):
            return await paced(request, rid, n)
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        created = int(time.time())
        mono = time.perf_counter()
        parts = [role % (rid, created, time.time(), mono)]
        for i in range(n):
            mono = time.perf_counter()
            if i == 0:
                first_chunk[rid] = mono
            parts.append(content % (rid, created, i, time.time(), mono))
        now = time.perf_counter()
        parts.append(final % (rid, created, time.time(), now))
        parts.append(usage % (rid, created, 16, 16 + n, n, time.time(), now))
        parts.append(b"data: [DONE]\n\n")
        # zero delay: all chunks are ready at once, so they go out in one write
        await resp.write(b"".join(parts))
        await resp.write_eof()
        return resp

    async def stamps(request: web.Request) -> web.Response:
        out = {"first_chunk": first_chunk.copy(), "cpu_s": time.process_time()}
        first_chunk.clear()
        return web.json_response(out)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/stamps", stamps)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
        await site.start()
        tick = asyncio.create_task(ticker())
        ready.set()
        await asyncio.Event().wait()
        tick.cancel()

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the client as it was before the optimisation (verbatim copy of _Runner._stream) ----------


class BaselineRunner(replay_mod._Runner):
    async def _stream(
        self,
        spec: RequestSpec,
        url: str,
        data: bytes,
        sent: float,
        t0: float,
        state: dict[str, Any],
    ) -> RequestRecord:
        async with self.session.post(url, data=data, headers=self.headers) as resp:
            if resp.status != 200:
                text = await resp.text(errors="replace")
                try:
                    payload: Any = json.loads(text)
                except ValueError:
                    payload = None
                msg = replay_mod._error_message(
                    payload, text or resp.reason or f"HTTP {resp.status}"
                )
                return self._partial(spec, sent, t0, state, "error", msg, resp.status)
            itl: list[float] = state["itl"]
            last_event: float | None = None
            usage: dict[str, Any] | None = None
            async for raw in resp.content:
                if not raw.startswith(b"data:"):
                    continue  # blank separators, comments, event: lines
                payload_bytes = raw[5:].strip()
                if payload_bytes == b"[DONE]":
                    break
                now = time.perf_counter()
                try:
                    chunk = json.loads(payload_bytes)
                except ValueError:
                    return self._partial(
                        spec, sent, t0, state, "error", f"malformed SSE data: {raw[:200]!r}", 200
                    )
                if not isinstance(chunk, dict):
                    continue
                if chunk.get("error"):
                    msg = replay_mod._error_message(chunk, "error chunk in stream")
                    return self._partial(spec, sent, t0, state, "error", msg, 200)
                choices = chunk.get("choices")
                if choices:
                    c0 = choices[0]
                    delta = c0.get("delta")
                    text = c0.get("text")
                    if not text and delta:
                        text = (
                            delta.get("content")
                            or delta.get("reasoning_content")
                            or delta.get("reasoning")
                        )
                    if text:
                        if state["ttft"] is None:
                            state["ttft"] = now - sent
                        else:
                            itl.append(now - state["last"])
                        state["last"] = now
                        state["chunks"] += 1
                        last_event = now
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    last_event = now
            if state["ttft"] is None:
                return self._partial(
                    spec, sent, t0, state, "error", "stream ended without generated text", 200
                )
            prompt_tokens = output_tokens = None
            if usage is not None:
                prompt_tokens = usage.get("prompt_tokens")
                output_tokens = usage.get("completion_tokens")
            if output_tokens is None:
                output_tokens = state["chunks"]
            assert last_event is not None
            return RequestRecord(
                index=spec.index,
                status="ok",
                t_sent_s=sent - t0,
                ttft_s=state["ttft"],
                itl_s=tuple(itl),
                e2e_s=last_event - sent,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                http_status=200,
                warmup=spec.warmup,
            )


CLIENTS: dict[str, type[replay_mod._Runner]] = {
    "baseline": BaselineRunner,
    "current": replay_mod._Runner,
}


class _use_client:  # noqa: N801 - a context manager used like a function
    """Make :func:`tuner.replay.replay` use one of :data:`CLIENTS` inside the block."""

    def __init__(self, name: str) -> None:
        self.cls = CLIENTS[name]
        self.saved = replay_mod._Runner

    def __enter__(self) -> None:
        replay_mod._Runner = self.cls  # type: ignore[misc]

    def __exit__(self, *exc: object) -> None:
        replay_mod._Runner = self.saved  # type: ignore[misc]


# --- measurements ------------------------------------------------------------------------------


def _specs(
    n: int, tokens: int, arrivals: Sequence[float] | None = None, paced: bool = False
) -> list[RequestSpec]:
    return [
        RequestSpec(
            index=i,
            endpoint="chat",
            body={
                "messages": [{"role": "user", "content": "hello " * 8}],
                "max_tokens": tokens,
                "ignore_eos": True,
                "x_id": i,
                "x_paced": paced,
            },
            prompt_tokens=16,
            output_tokens=tokens,
            arrival_s=None if arrivals is None else arrivals[i],
        )
        for i in range(n)
    ]


_SERVER_CPU = [0.0]


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


async def _run(
    base: str, client: str, specs: list[RequestSpec], arrival: ArrivalConfig
) -> dict[str, Any]:
    starts: list[float] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with _use_client(client):
        records = await replay(
            base,
            "m",
            specs,
            arrival,
            duration_s=600.0,
            request_timeout_s=120.0,
            on_start=starts.append,
        )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    async with aiohttp.ClientSession() as s, s.get(base + "/stamps") as r:
        server = await r.json()
    server_cpu = server["cpu_s"] - _SERVER_CPU[0]
    _SERVER_CPU[0] = server["cpu_s"]
    first = {int(k): v for k, v in server["first_chunk"].items()}
    (t0,) = starts
    ok = [r for r in records if r.status == "ok" and r.ttft_s is not None]
    added = [t0 + r.t_sent_s + (r.ttft_s or 0.0) - first[r.index] for r in ok]
    lag = [
        r.t_sent_s - s.arrival_s
        for r, s in zip(records, specs, strict=True)
        if s.arrival_s is not None
    ]
    span = max((r.t_sent_s + (r.e2e_s or 0.0) for r in ok), default=wall)
    return {
        "client": client,
        "requests": len(specs),
        "ok": len(ok),
        "added_p50_ms": _pct(added, 50) * 1e3,
        "added_p99_ms": _pct(added, 99) * 1e3,
        "added_max_ms": max(added, default=float("nan")) * 1e3,
        "send_lag_p99_ms": _pct(lag, 99) * 1e3 if lag else None,
        "req_per_s": len(ok) / span if span > 0 else 0.0,
        "client_cpu": cpu / wall,
        "server_cpu": server_cpu / wall,
    }


async def closed_loop(
    base: str, client: str, concurrency: int, n: int, tokens: int, paced: bool = False
) -> dict[str, Any]:
    specs = _specs(n, tokens, paced=paced)
    out = await _run(base, client, specs, ArrivalConfig(concurrency=concurrency))
    kind = f"paced {TICK_S * 1e3:.0f} ms steps" if paced else "zero delay"
    return {
        "scenario": f"{concurrency} streams, {kind}",
        "concurrency": concurrency,
        "paced": paced,
        **out,
    }


async def paced_streams(
    base: str, client: str, streams: int, n: int, tokens: int
) -> dict[str, Any]:
    """About ``streams`` streams open at once: arrivals at streams / (stream length) per second
    (spread out, as real traffic), each streaming one chunk per ``TICK_S`` engine step."""
    rate = streams / ((tokens + 1) * TICK_S)
    arrivals = [i / rate for i in range(n)]
    specs = _specs(n, tokens, arrivals, paced=True)
    out = await _run(base, client, specs, ArrivalConfig(kind="constant"))
    return {
        "scenario": f"{streams} streams, paced {TICK_S * 1e3:.0f} ms steps",
        "concurrency": streams,
        "paced": True,
        **out,
    }


async def open_loop(base: str, client: str, rate: float, step_s: float, tokens: int) -> dict:
    n = max(20, int(rate * step_s))
    arrivals = [i / rate for i in range(n)]
    out = await _run(base, client, _specs(n, tokens, arrivals), ArrivalConfig(kind="constant"))
    out["rate"] = rate
    out["sustained"] = bool(
        out["ok"] == n
        and (out["send_lag_p99_ms"] or 0.0) <= SEND_LAG_LIMIT_S * 1e3
        and out["req_per_s"] >= THROUGHPUT_SHARE * rate
    )
    return out


def _ladder(start: float) -> Iterator[float]:
    rate = start
    while True:
        yield rate
        rate = round(rate * 1.25, -1)


async def capacity(
    base: str, client: str, step_s: float, tokens: int, log: Callable[[str], None]
) -> tuple[float, list[dict[str, Any]]]:
    best, steps = 0.0, []
    failures = 0
    for rate in _ladder(200.0):
        res = await open_loop(base, client, rate, step_s, tokens)
        steps.append(res)
        log(
            f"  {client:8s} {rate:7.0f} req/s: sustained={res['sustained']!s:5s} "
            f"lag p99 {res['send_lag_p99_ms']:.2f} ms, added p99 {res['added_p99_ms']:.2f} ms, "
            f"cpu {res['client_cpu']:.0%}"
        )
        if res["sustained"]:
            best, failures = rate, 0
        else:
            failures += 1
            if failures >= 2:
                break
    return best, steps


async def main_async(args: argparse.Namespace, base: str) -> dict[str, Any]:
    def log(msg: str) -> None:
        print(msg, flush=True)

    clients = ["baseline", "current"]
    n100, n1000 = (600, 2000) if args.quick else (3000, 8000)
    p100, p1000 = (150, 1500) if args.quick else (300, 3000)
    # warm up both code paths (connections, imports) before measuring
    for client in clients:
        await closed_loop(base, client, 50, 200, args.tokens)
    rows: list[dict[str, Any]] = []
    plan = [(100, n100, False), (1000, n1000, False), (100, p100, True), (1000, p1000, True)]
    for conc, n, paced in plan:
        for client in clients:  # interleaved: same conditions for both
            if paced:
                res = await paced_streams(base, client, conc, n, args.tokens)
            else:
                res = await closed_loop(base, client, conc, n, args.tokens)
            rows.append(res)
            log(
                f"{res['scenario']:28s} {client:8s} added p50 {res['added_p50_ms']:7.2f} ms "
                f"p99 {res['added_p99_ms']:7.2f} ms  {res['req_per_s']:7.0f} req/s "
                f"cpu client {res['client_cpu']:.0%} server {res['server_cpu']:.0%}"
            )
    caps: dict[str, float] = {}
    ladders: dict[str, list[dict[str, Any]]] = {}
    for client in clients:
        caps[client], ladders[client] = await capacity(base, client, args.step_s, args.tokens, log)
    # paced: open loop at half the current client's capacity, many streams open at once
    for client in clients:
        rate = max(100.0, caps["current"] / 2)
        res = await open_loop(base, client, rate, args.step_s, args.tokens)
        res["scenario"] = f"open {rate:.0f} req/s"
        rows.append(res)
        log(
            f"{res['scenario']:18s} {client:8s} added p50 {res['added_p50_ms']:7.2f} ms "
            f"p99 {res['added_p99_ms']:7.2f} ms"
        )
    return {"rows": rows, "capacity_req_per_s": caps, "ladders": ladders}


def table(result: dict[str, Any]) -> str:
    lines = [
        "| scenario | client | added p50 ms | added p99 ms | req/s | client CPU | server CPU |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['scenario']} | {r['client']} | {r['added_p50_ms']:.3f} | "
            f"{r['added_p99_ms']:.3f} | {r['req_per_s']:.0f} | {r['client_cpu']:.0%} | "
            f"{r['server_cpu']:.0%} |"
        )
    caps = result["capacity_req_per_s"]
    lines.append("")
    lines.append(
        "highest sustained open-loop rate on one core: "
        + ", ".join(f"{k} {v:.0f} req/s" for k, v in caps.items())
        + (f" (ratio {caps['current'] / caps['baseline']:.2f}x)" if caps.get("baseline") else "")
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32, help="content chunks per response")
    ap.add_argument("--step-s", type=float, default=2.0, help="seconds per capacity step")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/client_capacity.json")
    args = ap.parse_args()
    if args.quick:
        args.step_s = min(args.step_s, 1.0)

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    client_core = cores[0] if cores else None
    server_core = cores[1] if len(cores) > 1 else client_core
    _raise_nofile()
    port = _free_port()
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    server = ctx.Process(target=_server_main, args=(port, server_core, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise SystemExit("the server did not start")
        _pin(client_core)
        started = time.perf_counter()
        result = asyncio.run(main_async(args, f"http://127.0.0.1:{port}"))
    finally:
        server.terminate()
        server.join(5)
    result["setup"] = {
        "tokens_per_response": args.tokens,
        "step_s": args.step_s,
        "client_core": client_core,
        "server_core": server_core,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "machine": platform.processor() or platform.machine(),
        "wall_s": round(time.perf_counter() - started, 1),
        "sustained_if": {
            "send_lag_p99_ms": SEND_LAG_LIMIT_S * 1e3,
            "completed_share_of_rate": THROUGHPUT_SHARE,
        },
    }
    print()
    print(table(result))
    verdicts = {}
    for r in result["rows"]:
        if r.get("concurrency") == 1000 and r["client"] == "current":
            ok = r["added_p99_ms"] < 1.0
            verdicts[r["scenario"]] = {"holds": ok, "added_p99_ms": r["added_p99_ms"]}
            print(
                f"target < 1 ms p99 added at 1000 streams ({r['scenario']}): "
                f"{'holds' if ok else 'does not hold'} ({r['added_p99_ms']:.2f} ms)"
            )
    result["target_1ms_p99_at_1000"] = verdicts
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
