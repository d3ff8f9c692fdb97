"""The simulated engine's clock (tuner/sim/runtime.py): tokens keep their modelled times when the
event loop is starved, the lateness is measured and warned about, and bundling keeps TTFT/e2e."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

from prometheus_client import generate_latest

from tuner.sim.cli import parse_args
from tuner.sim.engine import Request
from tuner.sim.logs import SimLog
from tuner.sim.runtime import AsyncEngine
from tuner.sim.startup import resolve

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "models" / "qwen3-8b-dummy")
SPEEDUP = 1.0
HOG_S = 0.08
"""The event loop is blocked this long every 50 ms: longer than any catch-up a loop that slips
would allow, so a clock that lost the time would show."""


def make_engine(stream_ms: float = 0.0) -> tuple[AsyncEngine, io.StringIO]:
    s = resolve(parse_args(["serve", MODEL]), {})
    out = io.StringIO()
    engine = AsyncEngine(
        s,
        speedup=SPEEDUP,
        stream_interval=1,
        log=SimLog(out, io.StringIO()),
        log_stats=False,
        stream_ms=stream_ms,
    )
    return engine, out


def modelled_ends(prompts: list[list[int]], max_tokens: int) -> list[list[float]]:
    """Each request's token times in virtual time: the same scheduler, all sent at 0, no I/O."""
    engine, _ = make_engine()
    sched = engine.sched
    reqs = [Request(f"r{i}", p, max_tokens) for i, p in enumerate(prompts)]
    for r in reqs:
        sched.add(r, 0.0)
    times: dict[str, list[float]] = {r.rid: [] for r in reqs}
    t = 0.0
    while sched.has_work:
        res = sched.step(t)
        t += res.duration_s
        for r in res.emitted:
            times[r.rid].append(t)
    return [times[r.rid] for r in reqs]


async def serve(
    engine: AsyncEngine, prompts: list[list[int]], max_tokens: int, hog_s: float
) -> tuple[list[list[tuple[int, float]]], float]:
    """Send every prompt at once and collect each stream's (tokens, due wall time) chunks,
    recording each chunk's lag as the server does; ``hog_s``: every 50 ms the event loop is
    blocked that long (a busy host). Returns the chunks and the wall time of the sends."""
    engine.start()
    stop = asyncio.Event()

    async def hog() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.05)
            time.sleep(hog_s)  # noqa: ASYNC251 - blocks the loop, as a starved process would

    async def one(p: list[int]) -> list[tuple[int, float]]:
        chunks = []
        async for n, due in engine.generate(p, max_tokens):
            engine.lag.record(due)
            chunks.append((n, due))
        return chunks

    hogger = asyncio.create_task(hog()) if hog_s > 0 else None
    sent = time.monotonic()
    try:
        got = await asyncio.gather(*(one(p) for p in prompts))
    finally:
        stop.set()
        if hogger is not None:
            await hogger
        await engine.stop()
    return list(got), sent


PROMPTS = [[1000 * i + k for k in range(300)] for i in range(8)]
MAX_TOKENS = 40


def test_tokens_keep_their_modelled_times_when_the_loop_is_starved() -> None:
    # one request of 40 tokens: ~0.26 s of modelled (= wall) time, the loop blocked 80 ms in
    # every 50: each token's due time is still its modelled time (the clock did not slip by the
    # time the loop lost), only its lag grows
    prompts = PROMPTS[:1]
    want = modelled_ends(prompts, MAX_TOKENS)
    engine, _ = make_engine()
    got, sent = asyncio.run(serve(engine, prompts, MAX_TOKENS, hog_s=HOG_S))
    for chunks, times in zip(got, want, strict=True):
        assert sum(n for n, _ in chunks) == MAX_TOKENS
        dues = [due for _, due in chunks]
        # the engine's clock started at the first arrival, ~when they were sent
        t0 = engine.wall_at(0.0)
        model = [(d - t0) * SPEEDUP for d in dues]
        start = model[0] - times[0]
        assert abs(start - (sent - t0) * SPEEDUP) < 0.05 * SPEEDUP
        for m, t in zip(model, times, strict=True):
            assert abs(m - start - t) < 1e-6


def test_lag_metric_and_warning_when_the_loop_is_starved() -> None:
    engine, out = make_engine()
    asyncio.run(serve(engine, PROMPTS, MAX_TOKENS, hog_s=HOG_S))
    text = generate_latest(engine.metrics.registry).decode()
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("tuner_sim:stream_lag_seconds")
    }
    count = next(v for k, v in samples.items() if k.startswith("tuner_sim:stream_lag_seconds_c"))
    under_2ms = next(v for k, v in samples.items() if 'le="0.002"' in k)
    assert count == len(PROMPTS) * MAX_TOKENS
    assert under_2ms < count  # chunks that left late are counted as late
    msg = engine.lag.check(5.0)
    assert msg is not None and "Simulator behind its model" in msg
    assert "WARNING" in out.getvalue() and "late at p99" in out.getvalue()
    assert engine.lag.check(5.0) is None  # the window was emptied


def test_no_warning_when_the_host_keeps_up() -> None:
    engine, out = make_engine()
    for due in (100.0, 100.0, 100.0):  # written 1 ms after their modelled times
        engine.lag.record(due, now=due + 0.001)
    assert engine.lag.check(5.0) is None
    assert out.getvalue() == ""


def test_stream_ms_bundles_tokens_but_keeps_the_first_and_last_times() -> None:
    prompts = PROMPTS[:1]
    plain, _ = make_engine()
    bundled, _ = make_engine(stream_ms=20.0)  # a chunk per 20 ms of modelled time at most
    ((x,), _) = asyncio.run(serve(plain, prompts, MAX_TOKENS, hog_s=0.0))
    ((y,), _) = asyncio.run(serve(bundled, prompts, MAX_TOKENS, hog_s=0.0))
    assert len(y) < len(x) == MAX_TOKENS
    assert sum(n for n, _ in y) == MAX_TOKENS and y[0][0] == 1
    rel_x = [d - x[0][1] for _, d in x]  # each token's time after the first token's
    rel_y = [d - y[0][1] for _, d in y]
    assert abs(rel_x[-1] - rel_y[-1]) < 1e-6  # the last token at its own time: TPOT, e2e kept
    # each bundle leaves at the modelled time of its last token
    at = {round(d, 6): k for k, d in enumerate(rel_x)}
    sent = 0
    for n, d in zip((n for n, _ in y), rel_y, strict=True):
        sent += n
        assert at.get(round(d, 6)) == sent - 1
