"""How much latency the replay client (:mod:`tuner.replay`) adds, and how many requests/s it
sustains, in one process and spread over several (``replay(processes=P)``).

Setup: a zero-delay streaming server (aiohttp; ``--server-processes`` processes sharing one port
through SO_REUSEPORT, each pinned to a core of its own, so the server is not the bottleneck when
the client has many processes: check ``server_cpu_max`` in the rows) answers
``POST /v1/chat/completions`` with a role chunk, ``--tokens`` content chunks, a finish chunk, a
usage chunk and ``[DONE]`` in vLLM's OpenAI chunk format, immediately. Every chunk carries ``ts``
(``time.time()``) and ``mono`` (``time.perf_counter()``, CLOCK_MONOTONIC, which is system-wide on
Linux) of the moment the server wrote it, and each server process keeps the first content
chunk's ``mono`` per request id. The client (and its processes, which inherit the mask) runs on
the first P cores, the servers on the next ones.

* **Added latency** of request i = the client's receive time of its first content chunk
  (``t0 + t_sent_s + ttft_s``, ``t0`` from ``replay(on_start=...)``) minus the server's stamp of
  that chunk: socket delivery plus the time the client's event loop took to get to it.
  Scenarios: 100 and 1,000 streams closed loop against the zero-delay server (saturated: the
  client never waits, so this is mostly queueing behind other streams' chunks, and ``req/s`` is
  the client's saturated throughput); 100 and 1,000 streams *paced* (open loop, arrivals spread
  so that about that many streams are open; the server emits one chunk per stream every
  ``TICK_S`` engine step, all streams in the same step, as vLLM does; the steps of all server
  processes fall on the same instants); and open loop at half the client's capacity.
* **Capacity**: open loop at constant rates on a rising ladder, ``--step-s`` seconds each; a
  rate is sustained when every request succeeds, completions keep up (>= 95 % of the rate) and
  p99 send lateness (``t_sent_s - arrival_s``) is <= 50 ms. The highest sustained rate is
  reported (the ladder stops after two failures in a row).
* **IPC**: what taking the next request from the processes' shared counter costs, alone and
  with all P processes taking at once (``ipc`` in the JSON).

Each ``--processes`` value P runs every scenario (zero-delay request counts x P) for every client
variant of ``--clients``, interleaved, so their ratios are not confounded by the machine:

* ``current``: the tuner's client as it runs by default (only young objects are
  garbage-collected during the replay, :func:`tuner.replay_client.gc_paused`);
* ``baseline`` (P = 1 only): the client as it was before the per-chunk loop was optimised (its
  stream loop, kept below as it was, in place of ``Runner.read_stream``), without the GC pause;
* ``gc-on``: the current client with the garbage collector left alone (before the GC pause);
* ``uvloop``: the current client on libuv's event loop (``workload.client_loop=uvloop``).

Every replay runs on a fresh event loop of its variant's kind, in a worker thread (the main
loop, which only reads the server's stamps afterwards, is idle meanwhile). ``client_cpu`` counts
all client processes (1.0 = one core busy), ``parent_cpu`` the replaying process alone (with
P > 1 it only collects records).

**--auto**: the tuner's default client instead (``workload.client_processes=auto``,
:func:`tuner.replay.choose_client`): at 64, 256 and 1,000 paced streams (``--auto-streams``) on
25 ms engine steps (vLLM's at a study's loads, ``--tick-ms``), the processes auto takes for those
requests on this process's cores (the server on 8 of them, a quarter of a smaller machine, auto on
the others, with the default engine config: all cores but one for the server's engine), beside
one process in this process, the client before ``auto``. This process imports the tuner's stack
first (as ``--tuner-heap``), as the tuner's own process holds it. ``--reps`` (2) replays of each,
interleaved; a table of added p50/p99 per streams, client and process count, and whether auto
stays under 1 ms p99; the JSON (default ``benchmarks/results/client_capacity-auto.json``) keeps
each row with what auto chose and why (``auto_why``). About 2 minutes on the GPU host
(``scripts/gpu/k_client_auto.sh``), about 10 s with ``--quick``.

``python benchmarks/client_capacity.py [--processes 1 4 8] [--clients current gc-on uvloop]
[--tokens N] [--quick] [--auto [--auto-streams 64 256 1000] [--reps 2]] [--out PATH]``;
prints a table and writes ``--out`` (default ``benchmarks/results/client_capacity.json``). P = 1
takes about 2 minutes (``--quick``: ~20 s), each further P about as long. For the 1 ms target at
1,000 streams, on a 16-core machine (as measured on the GPU host: one run per P)::

    python benchmarks/client_capacity.py --processes 8 --server-processes 8 \
        --out benchmarks/results/client_capacity-h200host-p8.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
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
import tuner.replay_client as client_mod  # noqa: E402
from tuner.config import ArrivalConfig, EngineConfig, WorkloadConfig  # noqa: E402
from tuner.records import RequestRecord, RequestSpec  # noqa: E402
from tuner.replay import STEP_S, choose_client, replay  # noqa: E402
from tuner.replay_child import Claims  # noqa: E402

TICK_S = 0.05
"""Paced scenarios: the server's engine step (one token for every open stream per step), unless
``--tick-ms`` says otherwise (``--auto``: 25 ms, vLLM's step at a study's loads)."""
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


def _server_main(port: int, core: int | None, ready: Any, tick_s: float = TICK_S) -> None:
    """One server process: the traffic port is shared (SO_REUSEPORT, the kernel spreads the
    connections), ``/stamps`` is on a control port of its own, which the process binds (port 0)
    and sends back through ``ready`` (a pipe end). Paced streams get a chunk every ``tick_s``."""
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
        """Engine steps: every ``tick_s`` one future fires for all paced streams at once."""
        loop = asyncio.get_running_loop()
        loop_state["tick"] = loop.create_future()
        while True:  # on multiples of tick_s of the shared clock: every server process at once
            await asyncio.sleep(tick_s - time.perf_counter() % tick_s)
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
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096, reuse_port=True)
        await site.start()
        control = web.Application()
        control.router.add_get("/stamps", stamps)
        control_runner = web.AppRunner(control, access_log=None, handle_signals=False)
        await control_runner.setup()
        await web.TCPSite(control_runner, "127.0.0.1", 0).start()
        tick = asyncio.create_task(ticker())
        ready.send(int(control_runner.addresses[0][1]))
        ready.close()
        await asyncio.Event().wait()
        tick.cancel()

    asyncio.run(main())


def _reserve_port() -> socket.socket:
    """A bound (not listening) SO_REUSEPORT socket on a free loopback port: while it is open no
    other program gets the port, and the server processes (SO_REUSEPORT too) can still bind it.
    (Probing a free port and closing the probe let another program take it in between: seen on
    the GPU host with vLLM servers starting beside the benchmark.)"""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    return s


class ServerPool:
    """``n`` server processes on one port, each pinned to one of ``cores`` (round robin), with
    an engine step of ``tick_s`` for paced streams."""

    def __init__(self, n: int, cores: Sequence[int], tick_s: float = TICK_S) -> None:
        self.tick_s = tick_s
        self._reserved = _reserve_port()
        self.port = int(self._reserved.getsockname()[1])
        self.control_ports: list[int] = []
        self.cores = [cores[k % len(cores)] for k in range(n)] if cores else [None] * n
        self.procs: list[Any] = []
        self.cpu = [0.0] * n

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        for core in self.cores:
            ours, theirs = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_server_main, args=(self.port, core, theirs, self.tick_s), daemon=True
            )
            proc.start()
            theirs.close()
            self.procs.append(proc)
            if not ours.poll(30):
                raise SystemExit("a server process did not start")
            try:
                self.control_ports.append(int(ours.recv()))
            except EOFError:
                raise SystemExit("a server process failed to start (see its traceback)") from None
            ours.close()
        self._reserved.close()  # every server holds the port now

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join(5)

    async def stamps(self, wall: float) -> tuple[dict[int, float], float, float]:
        """First-chunk stamps of every request since the last call, and the servers' CPU over
        ``wall`` seconds: the sum (1.0 = one core) and the busiest process's share."""
        first: dict[int, float] = {}
        shares = []
        async with aiohttp.ClientSession() as s:
            for k, cport in enumerate(self.control_ports):
                async with s.get(f"http://127.0.0.1:{cport}/stamps") as r:
                    out = await r.json()
                first.update({int(i): v for i, v in out["first_chunk"].items()})
                shares.append((out["cpu_s"] - self.cpu[k]) / wall)
                self.cpu[k] = out["cpu_s"]
        return first, sum(shares), max(shares)


# --- the client as it was before the optimisation (its stream loop) ---------------------------


class BaselineRunner(client_mod.Runner):
    """The tuner's client with the stream loop it had before the per-chunk loop was optimised:
    an await per SSE line (``async for`` over the body), each chunk stamped when its line is
    read and parsed with ``json.loads``; the body is not read on after ``[DONE]``."""

    async def read_stream(
        self, content: aiohttp.StreamReader, sent: float, state: dict[str, Any]
    ) -> str | None:
        itl: list[float] = state["itl"]
        async for raw in content:
            if not raw.startswith(b"data:"):
                continue  # blank separators, comments, event: lines
            payload_bytes = raw[5:].strip()
            if payload_bytes == b"[DONE]":
                break
            now = time.perf_counter()
            try:
                chunk = json.loads(payload_bytes)
            except ValueError:
                return f"malformed SSE data: {raw[:200]!r}"
            if not isinstance(chunk, dict):
                continue
            if chunk.get("error"):
                return client_mod.error_message(chunk, "error chunk in stream")
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
                    state["end"] = now
            if chunk.get("usage"):
                state["usage"] = chunk["usage"]
                state["end"] = now
        return None


@dataclasses.dataclass(frozen=True)
class Client:
    runner: type[client_mod.Runner]
    pause_gc: bool
    loop: str
    about: str


CLIENTS: dict[str, Client] = {
    "baseline": Client(
        BaselineRunner, False, "asyncio", "before the per-chunk loop was optimised (P = 1 only)"
    ),
    "gc-on": Client(client_mod.Runner, False, "asyncio", "the current client without the GC pause"),
    "current": Client(client_mod.Runner, True, "asyncio", "the tuner's client, defaults"),
    "uvloop": Client(client_mod.Runner, True, "uvloop", "workload.client_loop=uvloop"),
}


class _use_client:  # noqa: N801 - a context manager used like a function
    """Make :func:`tuner.replay.replay` use one of :data:`CLIENTS`' runners inside the block (the
    ``Runner`` it calls is the name in :mod:`tuner.replay`'s namespace, with one process)."""

    def __init__(self, name: str) -> None:
        self.cls = CLIENTS[name].runner
        self.saved = replay_mod.Runner

    def __enter__(self) -> None:
        replay_mod.Runner = self.cls  # type: ignore[misc]

    def __exit__(self, *exc: object) -> None:
        replay_mod.Runner = self.saved  # type: ignore[misc]


# --- measurements ------------------------------------------------------------------------------


class _GcWatch:
    """Durations of this process's collections of generation 1 or 2 inside the block."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._t = 0.0

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] < 1:
            return
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._t)

    def __enter__(self) -> _GcWatch:
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._cb)


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


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children (the replay's client processes are reaped
    when it ends; the server processes only at exit)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


async def _run(
    servers: ServerPool,
    client: str,
    specs: list[RequestSpec],
    arrival: ArrivalConfig,
    processes: int,
) -> dict[str, Any]:
    starts: list[float] = []
    variant = CLIENTS[client]
    own = client_mod.ClientStats()

    def run_in_own_loop() -> list[RequestRecord]:
        # a fresh event loop of the variant's kind (as the tuner's process runs the replay on
        # the loop of workload.client_loop); this thread's loop is idle meanwhile
        with asyncio.Runner(loop_factory=client_mod.loop_factory(variant.loop)) as runner:
            return runner.run(
                replay(
                    servers.base,
                    "m",
                    specs,
                    arrival,
                    duration_s=600.0,
                    request_timeout_s=120.0,
                    on_start=starts.append,
                    processes=processes,
                    client_loop=variant.loop,
                    pause_gc=variant.pause_gc,
                    stats=own,
                )
            )

    cpu0, kids0, wall0 = time.process_time(), _children_cpu(), time.perf_counter()
    with _use_client(client), _GcWatch() as gcw:
        records = await asyncio.to_thread(run_in_own_loop)
    wall = time.perf_counter() - wall0
    parent_cpu = time.process_time() - cpu0
    client_cpu = parent_cpu + _children_cpu() - kids0
    first, server_cpu, server_cpu_max = await servers.stamps(wall)
    (t0,) = starts
    ok = [r for r in records if r.status == "ok" and r.ttft_s is not None]
    added = [t0 + r.t_sent_s + (r.ttft_s or 0.0) - first[r.index] for r in ok]
    lag = [
        r.t_sent_s - s.arrival_s
        for r, s in zip(records, specs, strict=True)
        if s.arrival_s is not None
    ]
    span = max((r.t_sent_s + (r.e2e_s or 0.0) for r in ok), default=wall)
    probe = own.summary()
    return {
        "client": client,
        "processes": processes,
        "client_cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
        "requests": len(specs),
        "ok": len(ok),
        "added_p50_ms": _pct(added, 50) * 1e3,
        "added_p99_ms": _pct(added, 99) * 1e3,
        "added_max_ms": max(added, default=float("nan")) * 1e3,
        "send_lag_p99_ms": _pct(lag, 99) * 1e3 if lag else None,
        "req_per_s": len(ok) / span if span > 0 else 0.0,
        "client_cpu": client_cpu / wall,
        "parent_cpu": parent_cpu / wall,
        "server_cpu": server_cpu,
        "server_cpu_max": server_cpu_max,
        # collections of the older generations in this process during the replay (the client
        # processes' are not seen): how many, and the longest stall
        "gc_older_collections": len(gcw.pauses),
        "gc_older_max_ms": max(gcw.pauses, default=0.0) * 1e3,
        # the tuner's own lag probe (what a study records as client_lag_*), to hold against
        # the added latency measured from the server's stamps
        "probe_lag_p99_ms": probe.get("client_lag_p99_ms"),
        "probe_lag_max_ms": probe.get("client_lag_max_ms"),
    }


async def closed_loop(
    servers: ServerPool,
    client: str,
    concurrency: int,
    n: int,
    tokens: int,
    processes: int = 1,
    paced: bool = False,
) -> dict[str, Any]:
    specs = _specs(n, tokens, paced=paced)
    arrival = ArrivalConfig(concurrency=concurrency)
    out = await _run(servers, client, specs, arrival, processes)
    kind = f"paced {servers.tick_s * 1e3:.0f} ms steps" if paced else "zero delay"
    return {
        "scenario": f"{concurrency} streams, {kind}",
        "concurrency": concurrency,
        "paced": paced,
        **out,
    }


def paced_specs(streams: int, n: int, tokens: int, tick_s: float) -> list[RequestSpec]:
    """``n`` requests arriving at streams / (stream length) per second (spread out, as real
    traffic), so that about ``streams`` are open at once, each streaming one chunk per ``tick_s``
    engine step."""
    rate = streams / ((tokens + 1) * tick_s)
    return _specs(n, tokens, [i / rate for i in range(n)], paced=True)


async def paced_streams(
    servers: ServerPool, client: str, streams: int, n: int, tokens: int, processes: int = 1
) -> dict[str, Any]:
    """About ``streams`` streams open at once (:func:`paced_specs`) on the servers' step."""
    specs = paced_specs(streams, n, tokens, servers.tick_s)
    out = await _run(servers, client, specs, ArrivalConfig(kind="constant"), processes)
    return {
        "scenario": f"{streams} streams, paced {servers.tick_s * 1e3:.0f} ms steps",
        "concurrency": streams,
        "paced": True,
        **out,
    }


async def open_loop(
    servers: ServerPool, client: str, rate: float, step_s: float, tokens: int, processes: int = 1
) -> dict[str, Any]:
    n = max(20, int(rate * step_s))
    arrivals = [i / rate for i in range(n)]
    specs = _specs(n, tokens, arrivals)
    out = await _run(servers, client, specs, ArrivalConfig(kind="constant"), processes)
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
    servers: ServerPool,
    client: str,
    step_s: float,
    tokens: int,
    log: Callable[[str], None],
    processes: int = 1,
    start: float = 200.0,
) -> tuple[float, list[dict[str, Any]]]:
    best, steps = 0.0, []
    failures = 0
    for rate in _ladder(start):
        res = await open_loop(servers, client, rate, step_s, tokens, processes)
        steps.append(res)
        log(
            f"  {_label(client, processes):12s} {rate:7.0f} req/s: "
            f"sustained={res['sustained']!s:5s} lag p99 {res['send_lag_p99_ms']:.2f} ms, "
            f"added p99 {res['added_p99_ms']:.2f} ms, cpu {res['client_cpu']:.0%}"
        )
        if res["sustained"]:
            best, failures = rate, 0
        else:
            failures += 1
            if failures >= 2:
                break
    return best, steps


def _label(client: str, processes: int) -> str:
    """``current`` for one process (the JSON keys of earlier runs), ``current x4`` for four."""
    return client if processes == 1 else f"{client} x{processes}"


def _claim_worker(claims: Claims, n: int, start: Any, out: Any) -> None:
    start.wait()
    t = time.perf_counter()
    for _ in range(n):
        claims.take(1)
    out.put((time.perf_counter() - t) / n)


def claim_cost(processes: int, n: int = 200_000) -> dict[str, float]:
    """Seconds per take of the shared counter: alone, and with ``processes`` taking at once
    (the tight loop is the worst case; a real client takes once per request)."""
    ctx = mp.get_context("spawn")
    claims = Claims(ctx)
    t = time.perf_counter()
    for _ in range(n):
        claims.take(0)
    alone = (time.perf_counter() - t) / n
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_claim_worker, args=(claims, n, start, out)) for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    start.set()
    per = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(10)
    return {"processes": processes, "alone_us": alone * 1e6, "contended_us": max(per) * 1e6}


def _scaled(quick: bool, processes: int) -> tuple[int, int, int, int]:
    """Requests per scenario: zero-delay counts grow with the processes (same duration)."""
    n100, n1000 = (600, 2000) if quick else (3000, 8000)
    p100, p1000 = (150, 1500) if quick else (300, 3000)
    return n100 * processes, n1000 * processes, p100, p1000


async def main_async(args: argparse.Namespace, servers: ServerPool) -> dict[str, Any]:
    def log(msg: str) -> None:
        print(msg, flush=True)

    rows: list[dict[str, Any]] = []
    caps: dict[str, float] = {}
    ladders: dict[str, list[dict[str, Any]]] = {}
    capacity_rows: list[dict[str, Any]] = []
    for procs in args.processes:
        cores = _client_cores(args.client_pool, procs)
        if cores:
            os.sched_setaffinity(0, cores)  # the client processes inherit the mask
        clients = [c for c in args.clients if procs == 1 or c != "baseline"]
        if args.no_baseline:
            clients = [c for c in clients if c != "baseline"]
        log(f"--- {procs} client process{'es' if procs > 1 else ''} on cores {cores}")
        # warm up the code paths (connections, imports, process start) before measuring
        for client in clients:
            await closed_loop(servers, client, 50, 200, args.tokens, procs)
        n100, n1000, p100, p1000 = _scaled(args.quick, procs)
        plan = [(100, n100, False), (1000, n1000, False), (100, p100, True), (1000, p1000, True)]
        for conc, n, paced in plan:
            for client in clients:  # interleaved: same conditions for both
                if paced:
                    res = await paced_streams(servers, client, conc, n, args.tokens, procs)
                else:
                    res = await closed_loop(servers, client, conc, n, args.tokens, procs)
                rows.append(res)
                log(
                    f"{res['scenario']:28s} {_label(client, procs):12s} "
                    f"added p50 {res['added_p50_ms']:7.2f} ms p99 {res['added_p99_ms']:7.2f} ms "
                    f"{res['req_per_s']:7.0f} req/s cpu client {res['client_cpu']:.0%} "
                    f"server {res['server_cpu']:.0%} (busiest {res['server_cpu_max']:.0%})"
                )
        # later process counts start their ladder at half the best rate so far (saves steps)
        start = max([200.0] + [round(v / 2, -1) for v in caps.values()])
        for client in clients:
            label = _label(client, procs)
            caps[label], ladders[label] = await capacity(
                servers, client, args.step_s, args.tokens, log, procs, start
            )
            capacity_rows.append({"client": client, "processes": procs, "req_per_s": caps[label]})
        # open loop at half the current client's capacity, many streams open at once
        for client in clients:
            rate = max(100.0, caps[_label("current", procs)] / 2)
            res = await open_loop(servers, client, rate, args.step_s, args.tokens, procs)
            res["scenario"] = f"open {rate:.0f} req/s"
            rows.append(res)
            log(
                f"{res['scenario']:28s} {_label(client, procs):12s} "
                f"added p50 {res['added_p50_ms']:7.2f} ms p99 {res['added_p99_ms']:7.2f} ms"
            )
    ipc = [await asyncio.to_thread(claim_cost, p) for p in sorted(set(args.processes))]
    return {
        "rows": rows,
        "capacity_req_per_s": caps,
        "capacity": capacity_rows,
        "ladders": ladders,
        "ipc": ipc,
    }


# --- --auto: the tuner's default client at a study's loads ------------------------------------

AUTO_STREAMS = (64, 256, 1000)
"""``--auto``'s paced streams: chat's 64 (the quick start's load), 256 (the chat study of
docs/results.md) and 1,000."""


async def auto_mode(args: argparse.Namespace, servers: ServerPool) -> dict[str, Any]:
    """``--auto``: at each of ``args.auto_streams`` paced streams, the client processes the tuner
    takes by default (``workload.client_processes=auto``: :func:`tuner.replay.choose_client` of
    these requests, with the default engine config, on this process's cores), measured beside one
    process in this process (the client before ``auto``; this process holds the tuner's heap),
    interleaved, ``args.reps`` replays each."""

    def log(msg: str) -> None:
        print(msg, flush=True)

    if args.client_pool:
        os.sched_setaffinity(0, args.client_pool)  # what auto may use; its processes inherit it
    workload = WorkloadConfig(name="client_capacity", arrival=ArrivalConfig(kind="constant"))
    await closed_loop(servers, "current", 50, 200, args.tokens, 1)  # imports, connections
    rows: list[dict[str, Any]] = []
    for streams in args.auto_streams:
        n = max(300, streams) if args.quick else max(1000, 3 * streams)
        specs = paced_specs(streams, n, args.tokens, servers.tick_s)
        choice = choose_client(workload, EngineConfig(), specs)
        log(f"--- {streams} paced streams: auto takes {choice.describe()}")
        variants = [("auto", choice.processes)]
        if choice.processes > 1:  # else auto is the one process already
            variants.append(("one process", 1))
        for rep in range(1, args.reps + 1):
            for label, procs in variants:
                out = await _run(servers, "current", specs, workload.arrival, procs)
                rows.append(
                    {
                        "scenario": f"{streams} streams, paced {servers.tick_s * 1e3:.0f} ms steps",
                        "streams": streams,
                        "variant": label,
                        "rep": rep,
                        "auto_in_flight": choice.in_flight,
                        "auto_processes": choice.processes,
                        "auto_cores": choice.cores,
                        "auto_why": choice.describe(),
                        **out,
                    }
                )
                log(
                    f"{streams:5d} streams {label:12s} x{procs:<3d} added p50 "
                    f"{out['added_p50_ms']:7.3f} ms p99 {out['added_p99_ms']:7.3f} ms, probe lag "
                    f"p99 {out['probe_lag_p99_ms'] or float('nan'):.2f} ms, {out['ok']}/{n} ok"
                )
    summary = {}
    for streams in args.auto_streams:
        mine = [r for r in rows if r["streams"] == streams and r["variant"] == "auto"]
        worst = max(r["added_p99_ms"] for r in mine)
        summary[str(streams)] = {
            "auto_processes": mine[0]["auto_processes"],
            "added_p99_ms": [r["added_p99_ms"] for r in mine],
            "holds_1ms_p99": worst < 1.0,
        }
    return {"auto": rows, "auto_summary": summary}


def auto_table(result: dict[str, Any]) -> str:
    lines = [
        "| streams | client | processes | added p50 ms | added p99 ms | added max ms | probe lag "
        "p99 ms | client CPU | server CPU (busiest) | ok |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["auto"]:
        lines.append(
            f"| {r['streams']} | {r['variant']} | {r['processes']} | {r['added_p50_ms']:.3f} | "
            f"{r['added_p99_ms']:.3f} | {r['added_max_ms']:.2f} | "
            f"{r['probe_lag_p99_ms'] or float('nan'):.2f} | {r['client_cpu']:.0%} | "
            f"{r['server_cpu']:.0%} ({r['server_cpu_max']:.0%}) | {r['ok']}/{r['requests']} |"
        )
    lines.append("")
    for streams, v in result["auto_summary"].items():
        p99 = ", ".join(f"{x:.2f}" for x in v["added_p99_ms"])
        lines.append(
            f"auto at {streams} streams: {v['auto_processes']} process(es), added p99 {p99} ms: "
            f"< 1 ms {'holds' if v['holds_1ms_p99'] else 'does not hold'}"
        )
    lines += _busy_server(result["auto"])
    return "\n".join(lines)


def _busy_server(rows: list[dict[str, Any]]) -> list[str]:
    """A warning line when a server process was over 80 % busy: it may have set the pace."""
    busy = [r for r in rows if r.get("server_cpu_max", 0.0) > 0.8]
    if not busy:
        return []
    return [
        f"warning: a server process was > 80 % busy in {len(busy)} row(s); the server may "
        "have limited those (add --server-processes or cores)"
    ]


def table(result: dict[str, Any]) -> str:
    lines = [
        "| scenario | client | processes | added p50 ms | added p99 ms | req/s | client CPU "
        "| server CPU (busiest) | older-gen GCs (longest ms) | probe lag p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['scenario']} | {r['client']} | {r.get('processes', 1)} | "
            f"{r['added_p50_ms']:.3f} | {r['added_p99_ms']:.3f} | {r['req_per_s']:.0f} | "
            f"{r['client_cpu']:.0%} | {r['server_cpu']:.0%} ({r.get('server_cpu_max', 0.0):.0%}) | "
            f"{r.get('gc_older_collections', 0)} ({r.get('gc_older_max_ms', 0.0):.1f}) | "
            f"{r.get('probe_lag_p99_ms') or float('nan'):.2f} |"
        )
    caps = result["capacity_req_per_s"]
    lines.append("")
    lines.append(
        "highest sustained open-loop rate: "
        + ", ".join(f"{k} {v:.0f} req/s" for k, v in caps.items())
        + (
            f" (current/baseline {caps['current'] / caps['baseline']:.2f}x)"
            if caps.get("baseline") and "current" in caps
            else ""
        )
    )
    for c in result.get("ipc", []):
        lines.append(
            f"shared counter: {c['alone_us']:.2f} us per take alone, "
            f"{c['contended_us']:.2f} us with {c['processes']} processes taking at once"
        )
    lines += _busy_server(result["rows"])
    return "\n".join(lines)


def _layout(cores: list[int], max_p: int, servers: int) -> tuple[list[int], list[int]]:
    """Client cores (the first ``max_p``) and server cores (the next ``servers``); with fewer
    cores than that, the servers take the last ones and the client the rest (or all)."""
    if len(cores) >= max_p + servers:
        return cores[:max_p], cores[max_p : max_p + servers]
    server_cores = cores[-min(servers, max(1, len(cores) - 1)) :] if cores else []
    client_cores = [c for c in cores if c not in server_cores] or list(cores)
    return client_cores, server_cores


def _client_cores(pool: list[int], processes: int) -> list[int]:
    return pool[:processes] if pool else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--processes",
        type=int,
        nargs="+",
        default=[1],
        help="client process counts to measure, e.g. 1 4 8 (default: 1)",
    )
    ap.add_argument(
        "--server-processes",
        type=int,
        default=0,
        help="zero-delay server processes (default: as many as the largest --processes, "
        "within the cores left)",
    )
    ap.add_argument("--tokens", type=int, default=32, help="content chunks per response")
    ap.add_argument("--step-s", type=float, default=2.0, help="seconds per capacity step")
    ap.add_argument("--quick", action="store_true", help="fewer requests, 1 s capacity steps")
    ap.add_argument(
        "--clients",
        nargs="+",
        choices=list(CLIENTS),
        default=["baseline", "current"],
        help="client variants, measured side by side (interleaved) at every process count: "
        + "; ".join(f"{k}: {v.about}" for k, v in CLIENTS.items())
        + " (default: baseline current)",
    )
    ap.add_argument(
        "--no-baseline", action="store_true", help="skip the pre-optimisation client (P = 1)"
    )
    ap.add_argument(
        "--tuner-heap",
        action="store_true",
        help="import the tuner's whole stack first (tuner.study: Optuna, MLflow, SQLAlchemy, "
        "plotly), so the replaying process holds the objects the tuner's process does (with one "
        "client process the replay runs inside the tuner's process)",
    )
    ap.add_argument(
        "--auto",
        action="store_true",
        help="the tuner's default client instead of the scenarios above: the processes "
        "workload.client_processes=auto takes at each of --auto-streams paced streams (25 ms "
        "steps), beside one process in this process, which holds the tuner's heap "
        "(--tuner-heap); --processes is not used",
    )
    ap.add_argument(
        "--auto-streams",
        type=int,
        nargs="+",
        default=list(AUTO_STREAMS),
        help="--auto: paced streams (default: %(default)s)",
    )
    ap.add_argument(
        "--reps", type=int, default=2, help="--auto: replays of each (default 2; --quick: 1)"
    )
    ap.add_argument(
        "--tick-ms",
        type=float,
        default=None,
        help=f"the server's engine step for paced streams (default {TICK_S * 1e3:.0f} ms; "
        f"--auto: {STEP_S * 1e3:.0f} ms, the step the tuner's auto assumes)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON result file (default: benchmarks/results/client_capacity.json; --auto: "
        "client_capacity-auto.json)",
    )
    args = ap.parse_args()
    if min(args.processes) < 1:
        ap.error("--processes: counts must be >= 1")
    if args.auto and (min(args.auto_streams) < 1 or args.reps < 1):
        ap.error("--auto-streams and --reps must be >= 1")
    if args.out is None:
        name = "client_capacity-auto.json" if args.auto else "client_capacity.json"
        args.out = ROOT / "benchmarks/results" / name
    tick_s = args.tick_ms / 1e3 if args.tick_ms else (STEP_S if args.auto else TICK_S)
    if args.auto:
        args.tuner_heap = True
        if args.quick:
            args.reps = 1
    if args.tuner_heap:
        import tuner.study  # noqa: F401

        gc.collect()
        print(f"tuner heap: {len(gc.get_objects())} objects tracked by the collector", flush=True)
    if "current" not in args.clients:  # the open-loop row runs at half its capacity
        args.clients.append("current")
    if args.quick:
        args.step_s = min(args.step_s, 1.0)

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    max_p = max(args.processes)
    n_servers = args.server_processes or max(1, min(max_p, len(cores) - max_p))
    if args.auto:  # the servers on 8 cores (a quarter of a small machine), auto on the rest
        n_servers = args.server_processes or max(1, min(8, len(cores) // 4))
        max_p = max(1, len(cores) - n_servers)
    args.client_pool, server_cores = _layout(cores, max_p, n_servers)
    shared = bool(cores) and len(cores) < max_p + n_servers
    if shared:
        print(
            f"note: {len(cores)} cores for {max_p} client and {n_servers} server processes: "
            "they share cores, so these are not capacity figures",
            flush=True,
        )
    _raise_nofile()  # the client processes inherit the limit
    servers = ServerPool(n_servers, server_cores, tick_s)
    servers.start()
    started = time.perf_counter()
    try:
        result = asyncio.run((auto_mode if args.auto else main_async)(args, servers))
    finally:
        servers.stop()
    result["setup"] = {
        "mode": "auto" if args.auto else "scenarios",
        "tick_ms": tick_s * 1e3,
        "tokens_per_response": args.tokens,
        "step_s": args.step_s,
        "processes": args.processes,
        "tuner_heap": args.tuner_heap,
        "clients": {k: CLIENTS[k].about for k in args.clients},
        "client_core": args.client_pool[0] if args.client_pool else None,
        "client_cores": args.client_pool,
        "server_core": server_cores[0] if server_cores else None,
        "server_cores": server_cores,
        "server_processes": n_servers,
        "cores_shared": shared,
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
    if args.auto:
        result["setup"]["auto_streams"] = args.auto_streams
        result["setup"]["reps"] = args.reps
        print(auto_table(result))
        _write(args.out, result)
        return
    print(table(result))
    verdicts = {}
    for r in result["rows"]:
        if r.get("concurrency") == 1000 and r["client"] in ("current", "uvloop"):
            ok = r["added_p99_ms"] < 1.0
            procs = r["processes"]
            key = r["scenario"] + ("" if procs == 1 else f", {procs} processes")
            if r["client"] != "current":  # the JSON keys of earlier runs are the current client's
                key += f", {r['client']}"
            verdicts[key] = {
                "holds": ok,
                "added_p99_ms": r["added_p99_ms"],
                "processes": procs,
                "client": r["client"],
            }
            print(
                f"target < 1 ms p99 added at 1000 streams ({key}): "
                f"{'holds' if ok else 'does not hold'} ({r['added_p99_ms']:.2f} ms)"
            )
    result["target_1ms_p99_at_1000"] = verdicts
    _write(args.out, result)


def _write(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
