"""``run_server``'s rules through an in-process fake server (``TrialContext.start_server``): no
subprocess, no simulator; the engine is :class:`FakeVLLM` served on a loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from test_replay import FakeVLLM

import tuner.capacity_probe as capacity_probe
from tuner.artifacts import TrialFolder, trial_dir
from tuner.capacity import Step
from tuner.config import EngineConfig, TunerConfig
from tuner.engine.process import Server
from tuner.errors import FailureReason, LaunchFailed, ReplayFailed
from tuner.measure import Replay
from tuner.memory import ModelShape
from tuner.records import LaunchInfo
from tuner.trial import ServerRun, TrialContext, carried_failure, run_server, run_trial
from tuner.workload import build_requests

SMALL = [
    "+workload=chat",
    "engine=sim",
    "tracking=none",
    "workload.num_requests=8",
    "workload.warmup_requests=0",
    "workload.turns=1",
    "workload.output_tokens.low=2",
    "workload.output_tokens.high=3",
    "workload.slo.tpot_ms=null",
]

CLASH = "OSError: [Errno 98] error while attempting to bind on address: Address already in use"


class Loaded(FakeVLLM):
    """:class:`FakeVLLM` whose first token waits ``per_request_s`` for each request in flight
    (itself included): its latency grows in proportion to the concurrency."""

    def __init__(self, per_request_s: float = 0.0) -> None:
        super().__init__()
        self.per_request_s = per_request_s

    async def _respond(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        await asyncio.sleep(self.per_request_s * self.in_flight)
        return await super()._respond(request, body)


def engine_app(fake: FakeVLLM) -> web.Application:
    """``fake`` behind vLLM's routes the trial uses: completions, ``/metrics`` (its requests in
    flight), the cache resets."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            text=f"vllm:num_requests_running {fake.in_flight}\nvllm:num_requests_waiting 0\n"
        )

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", fake.handle)
    app.router.add_post("/v1/chat/completions", fake.handle)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/reset_prefix_cache", ok)
    app.router.add_post("/reset_mm_cache", ok)
    return app


class InProcess(Server):
    """A :class:`Server` whose engine is already serving at ``url`` in this process: starting
    it writes its log (and fails as told), ``check`` fails from its ``dies_at``-th call on."""

    def __init__(self, url: str, log_line: str, fail: bool, dies_at: int | None, **kw: Any):
        super().__init__([], env={}, **kw)
        self.url, self.log_line, self.fail, self.dies_at = url, log_line, fail, dies_at
        self.checks = 0

    @property
    def base_url(self) -> str:
        return self.url

    async def start(self) -> LaunchInfo:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(self.log_line + "\n")
        if self.fail:
            raise LaunchFailed(FailureReason.CRASH, self.log_line)
        self.ready = True
        return LaunchInfo(port=self.port, pid=0, startup_s=0.0)

    async def stop(self) -> None:
        self.stop_s = 0.0

    async def check(self, http: aiohttp.ClientSession) -> None:
        self.checks += 1
        if self.dies_at is not None and self.checks >= self.dies_at:
            raise ReplayFailed(FailureReason.ENGINE_DEAD, "EngineCore encountered a fatal error")


@dataclass
class Launcher:
    """The tests' ``start_server``: the launches' log lines in turn (the last one repeats), each
    but ``ready`` failing the launch; every port asked for."""

    url: str
    logs: list[str] = field(default_factory=lambda: ["ready"])
    dies_at: int | None = None
    ports: list[int] = field(default_factory=list)

    def __call__(self, run: ServerRun, engine: EngineConfig, env: dict[str, str]) -> Server:
        line = self.logs[min(len(self.ports), len(self.logs) - 1)]
        self.ports.append(run.port)
        log = TrialFolder(run.tdir).server_log
        kw = {"log_path": log, "host": engine.host, "port": run.port, "startup_timeout_s": 5.0}
        return InProcess(self.url, line, line != "ready", self.dies_at, **kw)


@pytest.fixture
def trial(make_cfg: Callable[..., TunerConfig], tmp_path: Path, serve_app: Any) -> Any:
    """``async with trial(fake, *overrides, **launcher) as (ctx, launcher)``: a context whose
    servers are ``fake``, served in this process."""

    @contextlib.asynccontextmanager
    async def make(fake: FakeVLLM, *overrides: str, **kw: Any) -> AsyncIterator[Any]:
        cfg = make_cfg(*SMALL, *overrides)
        async with serve_app(engine_app(fake)) as url:
            launcher = Launcher(url, **kw)
            shape = ModelShape.from_dir(cfg.model.files)
            reqs = build_requests(cfg.workload, cfg.model.files)
            yield (
                TrialContext(cfg, shape, reqs, [], tmp_path, None, start_server=launcher),
                launcher,
            )

    return make


async def serve(ctx: TrialContext, n: int, number: int = 0, prune: bool = True) -> list[Any]:
    """``n`` replays of the workload (``repeat_K/`` after the first) on one server."""
    w = ctx.cfg.workload
    replays = [Replay(f"repeat_{k + 1}" if k else "", ctx.requests, w) for k in range(n)]
    return await run_server(ctx, number, {}, True, folder(ctx, number).path, replays, prune=prune)


def folder(ctx: TrialContext, number: int = 0) -> TrialFolder:
    return TrialFolder(trial_dir(ctx.run_dir, number))


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
