"""An in-process engine for ``run_server``'s unit tests (``TrialContext.start_server``): no
subprocess, no simulator; the engine is :class:`~helpers.fake_vllm.FakeVLLM` served on a
loopback port. The ``trial`` fixture (tests/unit/conftest.py) builds a context on it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from helpers.fake_vllm import FakeVLLM
from tuner.artifacts import TrialFolder, trial_dir
from tuner.config import EngineConfig, TunerConfig
from tuner.engine.process import Server
from tuner.errors import FailureReason, LaunchFailed, ReplayFailed
from tuner.measure import Replay
from tuner.memory import ModelShape
from tuner.records import LaunchInfo
from tuner.trial import ServerRun, TrialContext, run_server
from tuner.workload import build_requests

SMALL = [
    "+workload=chat",
    "engine=sim",
    "tracking=none",
    # one replay per repeat, as the rules under test count them; capacity tests ask for it
    "objective=throughput",
    "workload.num_requests=8",
    "workload.warmup_requests=0",
    "workload.turns=1",
    "workload.output_tokens.low=2",
    "workload.output_tokens.high=3",
    "workload.slo.tpot_ms=null",
    # the fake server keeps the wall clock's time: its latencies are measured as they are
    # (tuner.engine.clock), not as a faster simulator's modelled ones
    "engine.env.TUNER_SIM_SPEEDUP=1",
]

CLASH = "OSError: [Errno 98] error while attempting to bind on address: Address already in use"


class Loaded(FakeVLLM):
    """:class:`FakeVLLM` whose first token waits ``per_request_s`` × (the requests in flight,
    itself included) ** ``power``: with ``power`` 1 its latency grows in proportion to the
    concurrency; with 2, a closed loop that its client refills late (a busy CI core: one slot
    fewer in flight when a request arrives) still fails where the curve says."""

    def __init__(self, per_request_s: float = 0.0, power: float = 1.0) -> None:
        super().__init__()
        self.per_request_s = per_request_s
        self.power = power

    async def _respond(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        await asyncio.sleep(self.per_request_s * self.in_flight**self.power)
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


async def serve(ctx: TrialContext, n: int, number: int = 0, prune: bool = True) -> list[Any]:
    """``n`` replays of the workload (``repeat_K/`` after the first) on one server."""
    w = ctx.cfg.workload
    replays = [Replay(f"repeat_{k + 1}" if k else "", ctx.requests, w) for k in range(n)]
    return await run_server(ctx, number, {}, True, folder(ctx, number).path, replays, prune=prune)


def folder(ctx: TrialContext, number: int = 0) -> TrialFolder:
    return TrialFolder(trial_dir(ctx.run_dir, number))


def trial_factory(make_cfg: Callable[..., TunerConfig], tmp_path: Path, serve_app: Any) -> Any:
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
