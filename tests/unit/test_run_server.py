"""``run_server``'s rules through an in-process fake server (``TrialContext.start_server``): no
subprocess, no simulator; the engine is :class:`FakeVLLM` served on a loopback port."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.fake_engine import CLASH, Loaded, folder, serve
from helpers.fake_vllm import FakeVLLM

import tuner.capacity_probe as capacity_probe
from tuner.capacity import Step
from tuner.trial import carried_failure, run_trial


def test_a_failure_carries_from_the_replay_it_hit_on() -> None:
    assert [carried_failure("dead", i, 2) for i in range(4)] == [None, "dead", "dead", "dead"]
    assert [carried_failure("dead", i, 0) for i in range(2)] == ["dead", "dead"]  # not launched
    assert [carried_failure(None, i, 2) for i in range(3)] == [None, None, None]


async def test_a_dead_engine_fails_its_replay_and_the_ones_after(trial: Any) -> None:
    fake = FakeVLLM()
    async with trial(fake, dies_at=2) as (ctx, _):
        first, hit, after = await serve(ctx, 3)
    assert first.failure_reason is None and first.metrics["completed"] == 8
    assert hit.failure_reason == after.failure_reason == "engine_dead"
    assert hit.metrics["completed"] == 8  # measured before the health check found it dead
    assert after.metrics["completed"] == 0  # never replayed
    assert len(fake.received) == 16
    assert json.loads(folder(ctx).result.read_text())["failure_reason"] is None


async def test_repeats_replay_on_one_server_and_average(trial: Any) -> None:
    fake = FakeVLLM()
    async with trial(fake) as (ctx, launcher):
        ctx.repeat_requests = [ctx.requests]
        result = await run_trial(ctx, 0, {}, True)
    assert len(launcher.ports) == 1 and len(fake.received) == 16  # one launch, two replays
    assert result.failure_reason is None and result.metrics["repeats"] == 2.0
    assert [r["repeat"] for r in json.loads(folder(ctx).repeats.read_text())] == [1, 2]
    assert folder(ctx).replay("repeat_2").result.is_file()


async def test_a_port_clash_launches_again_on_another_port(trial: Any) -> None:
    async with trial(FakeVLLM(), logs=[CLASH, "ready"]) as (ctx, launcher):
        (result,) = await serve(ctx, 1)
    assert result.failure_reason is None and result.launched
    assert len(launcher.ports) == 2 and launcher.ports[0] != launcher.ports[1]
    assert f"--port {launcher.ports[1]}" in " ".join(result.argv)
    assert CLASH in folder(ctx).attempt_log(1).read_text()
    assert folder(ctx).server_log.read_text() == "ready\n"


async def test_a_launch_failure_that_is_no_port_clash_is_not_retried(trial: Any) -> None:
    async with trial(FakeVLLM(), logs=["RuntimeError: engine core failed"]) as (ctx, launcher):
        (result,) = await serve(ctx, 1)
    assert len(launcher.ports) == 1
    assert result.failure_reason == "crash" and result.launched and result.values is None


async def test_a_lost_slo_prunes_the_replay_and_the_repeats_after_it(trial: Any) -> None:
    fake = Loaded(per_request_s=0.03)  # TTFT 30 ms and more: over the 10 ms SLO from the first
    async with trial(fake, "workload.slo.ttft_ms=10", "workload.arrival.concurrency=2") as (ctx, _):
        results = await serve(ctx, 2)
        kept = await serve(ctx, 2, number=1, prune=False)
    (pruned,) = results  # the second replay never ran
    assert pruned.pruned and "TTFT SLO" in pruned.pruned and pruned.failure_reason is None
    assert pruned.metrics["completed"] < 8
    assert [r.pruned for r in kept] == [None, None]  # prune=False: every replay to its end
    assert all(r.metrics["completed"] == 8 for r in kept)


async def test_the_capacity_bracket_over_a_latency_growing_with_concurrency(
    trial: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TTFT = 50 ms x requests in flight against a 125 ms SLO: 1 and 2 in flight hold (margins
    # 0.6 and 0.2), 4 do not (-0.6): the margin's line crosses zero at 2.5 in flight, factor 2.5
    # (the bracket's middle, factor 3, would be bisection's answer)
    monkeypatch.setattr(capacity_probe, "MIN_STEP_REQUESTS", 8)
    overrides = ["objective=capacity", "objective.capacity.max_steps=3"]
    overrides += ["workload.arrival.concurrency=1", "workload.slo.ttft_ms=125"]
    async with trial(Loaded(per_request_s=0.05), *overrides) as (ctx, _):
        (result,) = await serve(ctx, 1)
    assert result.failure_reason is None and result.pruned is None
    steps = [Step.from_row(r) for r in json.loads(folder(ctx).capacity.read_text())["steps"]]
    assert [(s.factor, s.held) for s in steps] == [(1.0, True), (2.0, True), (4.0, False)]
    assert folder(ctx).replay("capacity_2").requests.is_file()
    m = result.metrics
    lo, hi = steps[1], steps[2]
    assert m["capacity_factor"] == pytest.approx(2.5, abs=0.25)
    assert m["capacity_rps_low"] == lo.rps
    assert m["capacity_rps_low"] < m["capacity_rps"] < m["capacity_rps_high"]
    t = (m["capacity_factor"] - 2.0) / 2.0  # the crossing's share of the bracket
    rps = m["capacity_rps_low"] + t * (m["capacity_rps_high"] - m["capacity_rps_low"])
    assert m["capacity_rps"] == pytest.approx(rps)
    assert m["capacity_censored"] == 0.0 and m["capacity_steps"] == 3.0
    # a closed loop's rate (Little's law): about one request per 50 ms whatever the load
    assert lo.rps == pytest.approx(20.0, rel=0.3)
    assert hi.factor == 4.0
