"""tuner.measure.measure against the fake vLLM server (``tests/helpers/fake_vllm.py``): a capacity
step (a steady replay) ends once its counted requests have finished, without waiting for the
closed loop's drain."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.fake_vllm import FakeVLLM, spec

from tuner.config import ArrivalConfig, TunerConfig
from tuner.measure import Replay, measure

SLOTS = 3
DRAIN_S = 1.5  # the drain's requests take this long to their first token


def _step(cfg: TunerConfig, ttft: list[float], max_tokens: int, steady: bool = True) -> Replay:
    """A capacity step of ``SLOTS`` in flight: request i waits ``ttft[i]`` s to its first token."""
    specs = [spec(i, endpoint="chat", max_tokens=max_tokens, x_ttft=t) for i, t in enumerate(ttft)]
    w = dataclasses.replace(
        cfg.workload,
        arrival=ArrivalConfig(kind="concurrency", concurrency=SLOTS),
        num_requests=len(specs),
        warmup_requests=0,
    )
    return Replay("capacity_1", specs, w, steady=steady)


async def _replay(
    base: str, cfg: TunerConfig, tmp_path: Path, steady: bool
) -> tuple[list[int], float]:
    # 3 requests per slot: the start (0-2) and the drain (6-8) are not counted, 3-5 are
    rp = _step(cfg, [0.01] * 2 * SLOTS + [DRAIN_S] * SLOTS, 3, steady)
    assert rp.unsteady == frozenset({0, 1, 2, 6, 7, 8})
    t0 = time.perf_counter()
    m = await measure(cfg, base, tmp_path / f"steady-{steady}", [], rp, None)
    return sorted(r.index for r in m.records), time.perf_counter() - t0


async def test_a_steady_replay_does_not_wait_for_the_drain(
    server: tuple[str, FakeVLLM], make_cfg: Callable[..., TunerConfig], tmp_path: Path
) -> None:
    base, fake = server
    cfg = make_cfg("+workload=chat", "engine=sim")
    got, took = await _replay(base, cfg, tmp_path, steady=True)
    assert {3, 4, 5} <= set(got) and not set(got) & {6, 7, 8}, got  # every counted one, no drain
    assert took < DRAIN_S, took
    assert fake.in_flight == 0  # the drain's requests were cancelled, not left running
    # the workload's own replay (not steady) still waits for every request
    got, took = await _replay(base, cfg, tmp_path, steady=False)
    assert got == list(range(3 * SLOTS)) and took >= DRAIN_S, (got, took)


async def test_a_replay_on_the_simulator_is_measured_in_the_modelled_gpus_time(
    server: tuple[str, FakeVLLM], make_cfg: Callable[..., TunerConfig], tmp_path: Path
) -> None:
    """At ``TUNER_SIM_SPEEDUP`` 4 an open loop's sends leave 4 times sooner than their
    ``arrival_s`` and every time measured is 4 times the wall clock's: the modelled GPU's."""
    base, _ = server
    ttft = 0.2  # wall seconds the fake server waits before its first token
    specs = [spec(i, arrival_s=0.4 * i, x_ttft=ttft) for i in range(3)]

    async def run(*engine: str) -> tuple[list[float], list[float], float]:
        cfg = make_cfg("+workload=chat", *engine)
        w = dataclasses.replace(cfg.workload, num_requests=3, warmup_requests=0)
        t0 = time.perf_counter()
        m = await measure(cfg, base, tmp_path / engine[-1], [], Replay("r", specs, w), None)
        took = time.perf_counter() - t0
        return [r.t_sent_s for r in m.records], [r.ttft_s or 0.0 for r in m.records], took

    sent, ttfts, took = await run("engine=sim", "engine.env.TUNER_SIM_SPEEDUP=4")
    assert sent == pytest.approx([0.0, 0.4, 0.8], abs=0.1) and took < 0.8 + ttft, (sent, took)
    assert all(4 * ttft <= t < 4 * (ttft + 0.1) for t in ttfts), ttfts
    sent, ttfts, took = await run("engine=vllm")  # vLLM: the wall clock's own seconds
    assert sent == pytest.approx([0.0, 0.4, 0.8], abs=0.05) and took >= 0.8 + ttft, (sent, took)
    assert all(ttft <= t < ttft + 0.1 for t in ttfts), ttfts


async def test_a_lost_closed_loop_given_a_rate_runs_on_until_bound_to_serve_no_more(
    server: tuple[str, FakeVLLM], make_cfg: Callable[..., TunerConfig], tmp_path: Path
) -> None:
    # the capacity probe's step at the incumbent's load (tuner.score.PruneWatch's
    # served_at_most): 3 slots; the start (0-2) quick, the counted 3-5 0.3 s and 6-8 2 s to
    # their first token, all over a 100 ms TTFT SLO: lost once 3-5 finish (at ~0.35 s)
    base, _ = server
    cfg = make_cfg("+workload=chat", "engine=vllm", "workload.slo.ttft_ms=100")
    rp = _step(cfg, [0.05] * SLOTS + [0.3] * SLOTS + [2.0] * 2 * SLOTS, 2)
    judged = dataclasses.replace(cfg.objective, slo_constraints=True, prune=True)

    async def run(at_most: float | None) -> tuple[str | None, set[int], float]:
        t0 = time.perf_counter()
        m = await measure(cfg, base, tmp_path / f"r{at_most}", [], rp, judged, at_most)
        return m.pruned, {r.index for r in m.records}, time.perf_counter() - t0

    pruned, got, took = await run(None)  # no rate: stopped once lost
    assert pruned is not None and "TTFT" in pruned and took < 1.5 and not got & {6, 7, 8}
    # 3-5 alone bound the rate: 3 in flight x 6 counted / (3 x 0.3 s) = 20 req/s at most
    pruned, got, took = await run(25.0)
    assert pruned is not None and "serves at most" in pruned and took < 1.5, (pruned, took)
    # against 1 req/s it may yet serve more (3 / ~1.15 s ≈ 2.6): measured in full
    pruned, got, took = await run(1.0)
    assert pruned is None and {3, 4, 5, 6, 7, 8} <= got and took >= 2.0, (pruned, got, took)
