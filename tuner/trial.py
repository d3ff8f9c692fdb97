"""One trial: one server's life as a sequence of named steps over one :class:`ServerRun`.

::

    precheck → lease GPUs → wait for free GPU memory → launch (retried on a port clash)
             → for each replay: [reset caches] → measure (tuner.measure) → health check
             → stop the server → wait for its GPU memory to be released
             → teardown (mask logs, release the lease) → results

A failure at any step is data, not an exception: it ends the server's replays, and the replay it
hit and those after it carry it as their ``failure_reason``. :func:`run_trial` is one search
trial (its ``study.repeats`` replays averaged); the confirm stage calls :func:`run_server` with
its stress replays.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from tuner.artifacts import (
    keep_attempt_log,
    make_dir,
    mask_server_logs,
    trial_dir,
    write_artifacts,
    write_json,
    write_repeats,
    write_requests,
)
from tuner.capacity import Step, margin, search
from tuner.compile_cache import record
from tuner.config import EngineConfig, ObjectiveConfig, TunerConfig
from tuner.engine.argv import api_key, build_env, compile_key, mask, mask_argv, trial_argv
from tuner.engine.container import (
    CIDFILE,
    LEASE_LABEL,
    ContainerServer,
    container_name,
    wrap,
)
from tuner.engine.logparse import port_clash
from tuner.engine.pool import GpuPool, core_ranges
from tuner.engine.process import Server, free_port
from tuner.errors import EngineError, FailureReason, LaunchFailed, ReplayFailed, TrialFailed
from tuner.measure import Measured, Replay, measure, reset_caches
from tuner.memory import ModelShape
from tuner.precheck import precheck
from tuner.records import LaunchInfo, RequestSpec, TrialResult
from tuner.recovery import LEASE_ENV, Lease
from tuner.replay import is_closed_loop
from tuner.score import KEY_METRICS, constraints, needs_capacity, objective_values, summarize
from tuner.space import changed_params, resolved
from tuner.telemetry.gpu import (
    GpuMemory,
    gpu_memory,
    nvml_available,
    wait_for_free_memory,
    wait_for_used_memory,
)
from tuner.telemetry.prom import wait_idle
from tuner.workload import at_load, build_requests

__all__ = [
    "LAUNCH_ATTEMPTS",
    "ServerRun",
    "TrialContext",
    "gpu_freed",
    "lease_dir",
    "mean_result",
    "run_server",
    "run_trial",
]

log = logging.getLogger("tuner")

LAUNCH_ATTEMPTS = 3
"""Launches of one trial's server when a port it binds is taken while it starts (not the config's
fault: a server starting beside it, or another program, got the port first)."""


GPU_FREED_SLACK_GIB = 1.0
"""After a real server stopped, each of its GPUs counts as released once it uses at most this
much more than before the launch (a CUDA context is about 0.5 GiB; a server holds tens)."""

MIN_STEP_REQUESTS = 100
"""A capacity step measures at least this many requests: a p95 of fewer moves too much between
identical runs to say on which side of an SLO a load lies."""
CLOSED_LOOP_REQUESTS_PER_SLOT = 3
"""A capacity step of a closed loop sends at least this many requests per slot in flight: with
fewer, the load cannot build up (every request would be in flight at once)."""


def lease_dir(cfg: TunerConfig) -> Path:
    """Where each running trial's lease file lives (crash recovery reads them)."""
    return Path(cfg.paths.state_dir) / "leases"


@dataclass
class TrialContext:
    """What every trial of one run shares."""

    cfg: TunerConfig
    shape: ModelShape
    requests: list[RequestSpec]
    secrets: list[str]
    run_dir: Path
    cache_root: Path | None
    study_name: str = ""
    parent_run_id: str | None = None
    pool: GpuPool = field(default_factory=lambda: GpuPool([0]))
    engine_version: str | None = None
    cpu_sets: dict[int, list[int]] | None = None
    """``engine.cpu_pinning``: the CPU cores of each GPU's server."""
    repeat_requests: list[list[RequestSpec]] = field(default_factory=list)
    """The request streams of repeats 2.. (``study.repeats``: workload seed + 1, + 2, ...)."""


async def run_trial(
    ctx: TrialContext, number: int, params: dict[str, Any], baseline: bool
) -> TrialResult:
    """The trial's server, with ``study.repeats`` replays on it; one result (their mean)."""
    w = ctx.cfg.workload
    replays = [Replay("", ctx.requests, w)]
    for k, reqs in enumerate(ctx.repeat_requests, 1):
        replays.append(Replay(f"repeat_{k + 1}", reqs, replace(w, seed=w.seed + k)))
    tdir = trial_dir(ctx.run_dir, number)
    results = await run_server(ctx, number, params, baseline, tdir, replays, prune=True)
    if len(replays) == 1:
        return results[0]
    result = mean_result(results, ctx.cfg)
    write_repeats(tdir, results, result)
    return result


_SPREAD = ("goodput", "output_throughput")


def mean_result(results: list[TrialResult], cfg: TunerConfig) -> TrialResult:
    """One trial's repeats as one result: a failure or a prune decides (the first one); else
    every metric is the mean over the repeats, with the objectives and constraints recomputed from
    those means and ``<metric>_spread`` = (max - min) / mean for goodput and output tok/s."""
    bad = next((r for r in results if r.failure_reason or r.pruned), None)
    if bad is not None or len(results) == 1:
        return bad or results[0]
    keys = set.intersection(*(set(r.metrics) for r in results))
    metrics = {k: statistics.fmean(r.metrics[k] for r in results) for k in sorted(keys)}
    for k in _SPREAD:
        vals = [r.metrics[k] for r in results if k in r.metrics]
        if vals and metrics.get(k):
            metrics[f"{k}_spread"] = (max(vals) - min(vals)) / metrics[k]
    metrics["repeats"] = float(len(results))
    first = results[0]
    return replace(
        first,
        metrics=metrics,
        values=objective_values(metrics, cfg.objective),
        constraints=constraints(metrics, None, cfg.objective, cfg.workload.slo),
        duration_s=results[-1].duration_s,
    )


# --- one server's life ------------------------------------------------------------------------


@dataclass
class ServerRun:
    """One server's life: what each step of :func:`run_server` leaves for the next."""

    ctx: TrialContext
    number: int
    params: dict[str, Any]
    """As sampled (the launch line shows these)."""
    baseline: bool
    tdir: Path
    replays: list[Replay]
    prune: bool
    full: dict[str, Any]
    """Every searched param, vLLM's default where ``params`` leave one out."""
    port: int
    argv: list[str]
    t0: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.time)
    predicted: int | None = None
    gpus: list[int] = field(default_factory=list)
    gpu_before: list[GpuMemory] = field(default_factory=list)
    """The leased GPUs' memory before the launch (NVML; empty for the simulator)."""
    cpus: list[int] | None = None
    lease: Lease | None = None
    server: Server | None = None
    launch: LaunchInfo | None = None
    clash_s: float = 0.0
    """Server time of launches lost to a port taken in the meantime."""
    common: dict[str, float] = field(default_factory=dict)
    """Metrics every replay's result carries (GPU memory before launch, pinning, teardown)."""
    measured: list[Measured] = field(default_factory=list)
    written: set[int] = field(default_factory=set)
    """Replays whose ``requests.jsonl`` is on disk already."""
    failure: TrialFailed | None = None

    @property
    def cfg(self) -> TunerConfig:
        return self.ctx.cfg

    @property
    def shown_argv(self) -> tuple[str, ...]:
        return tuple(mask_argv(self.argv, self.ctx.secrets))

    @property
    def server_s(self) -> float:
        return (self.server.lifetime_s if self.server is not None else 0.0) + self.clash_s

    def result(
        self,
        rp: Replay,
        m: Measured,
        fail: TrialFailed | None,
        duration_s: float | None = None,
    ) -> TrialResult:
        """One replay's :class:`TrialResult`, with the metrics every replay of this server
        shares."""
        cfg = self.cfg
        records, pruned = m.records, m.pruned
        metrics = {**self.common, **m.telemetry, **summarize(records, rp.workload.slo)}
        if fail is not None:
            pruned = None
        elif records and metrics["error_rate"] >= 1.0:
            first = next((r.error for r in records if r.error), None)
            fail = ReplayFailed(FailureReason.REPLAY_ERRORS, first or "all requests failed")
            pruned = None
        reason = fail.reason.value if fail else None
        return TrialResult(
            number=self.number,
            params=self.full,
            argv=self.shown_argv,
            values=None if fail is not None else objective_values(metrics, cfg.objective),
            constraints=constraints(metrics, reason, cfg.objective, rp.workload.slo),
            metrics=metrics,
            failure_reason=reason,
            failure_detail=mask(fail.detail, self.ctx.secrets) if fail else None,
            launch=self.launch,
            predicted_kv_tokens=self.predicted,
            baseline=self.baseline,
            launched=self.server is not None,
            server_s=self.server_s,
            pruned=pruned,
            gpus=tuple(self.gpus),
            started_at=self.started_at,
            duration_s=(
                duration_s if duration_s is not None else round(time.monotonic() - self.t0, 3)
            ),
        )


async def run_server(
    ctx: TrialContext,
    number: int,
    params: dict[str, Any],
    baseline: bool,
    tdir: Path,
    replays: list[Replay],
    *,
    prune: bool,
) -> list[TrialResult]:
    """Precheck, launch one server with ``params``, run each replay on it, stop it: a result per
    replay. A failure ends the server's replays: the one it hit and those after it carry it."""
    cfg = ctx.cfg
    make_dir(tdir)
    port = free_port(cfg.engine.host)
    run = ServerRun(
        ctx,
        number,
        params,
        baseline,
        tdir,
        replays,
        prune,
        full=resolved(cfg.space, params),
        port=port,
        argv=trial_argv(cfg, params, port=port, baseline=baseline),
    )
    try:
        _precheck(run)
        tp = int(run.full.get("tensor_parallel_size") or 1)
        async with ctx.pool.lease(tp) as gpus:
            run.gpus = gpus
            try:
                await _prepare(run)
                async with contextlib.AsyncExitStack() as stack:
                    server = await _launch(run, stack)
                    await _replay_all(run, server)
                    if needs_capacity(cfg.objective):
                        await _capacity(run, server)
            except TrialFailed as exc:
                run.failure = exc
            # the server stopped: its memory released before the GPUs go back to the pool
            run.common.update(await gpu_freed(cfg, run.gpu_before, run.server))
    except TrialFailed as exc:
        run.failure = exc
    finally:
        _teardown(run)
    return _results(run)


def _precheck(run: ServerRun) -> None:
    """Refuse what certainly cannot start (raises :class:`TrialFailed`), and keep the memory
    model's KV prediction."""
    cfg = run.cfg
    all_requests = [r for rp in run.replays for r in rp.requests]
    verdict = precheck(
        cfg, run.ctx.shape, run.full, all_requests, baseline=run.baseline, veto=cfg.study.precheck
    )
    run.predicted = verdict.kv_tokens


async def _prepare(run: ServerRun) -> None:
    """On the leased GPUs: wait for their memory, write the lease file, choose the CPU cores."""
    ctx, cfg = run.ctx, run.cfg
    metrics, run.gpu_before = await _wait_gpu(cfg, run.full, run.gpus)
    run.common.update(metrics)
    box = cfg.engine.container
    run.lease = Lease.create(
        lease_dir(cfg),
        ctx.study_name,
        run.number,
        ctx.parent_run_id,
        cfg.tracking.uri if cfg.tracking.enabled else None,
        run.tdir,
        container_program=box.program if box is not None else None,
        cidfile=run.tdir / CIDFILE if box is not None else None,
    )
    if ctx.cpu_sets:
        run.cpus = sorted({c for g in run.gpus for c in ctx.cpu_sets[g]})
    if run.cpus:
        run.common["cpus_pinned"] = float(len(run.cpus))
        run.common["client_cpus"] = float(len(os.sched_getaffinity(0)))


async def _launch(run: ServerRun, stack: contextlib.AsyncExitStack) -> Server:
    """Start the server and wait until it is ready (``stack`` stops it); launch again on another
    port, up to :data:`LAUNCH_ATTEMPTS` times, when a port it binds was taken meanwhile."""
    ctx, cfg = run.ctx, run.cfg
    engine = replace(cfg.engine, gpus=run.gpus)  # CUDA_VISIBLE_DEVICES = the lease
    assert run.lease is not None
    env = {
        **build_env(engine, cache_root=ctx.cache_root, model=cfg.model),
        LEASE_ENV: run.lease.id,
    }
    log.info(
        "trial %d: launching on GPU %s%s with %s",
        run.number,
        run.gpus,
        f" (CPUs {core_ranges(run.cpus)})" if run.cpus else "",
        changed_params(run.params, cfg.space),
    )
    for attempt in range(1, LAUNCH_ATTEMPTS + 1):
        where: dict[str, Any] = {
            "log_path": run.tdir / "server.log",
            "host": cfg.engine.host,
            "port": run.port,
            "startup_timeout_s": cfg.engine.startup_timeout_s,
            "stop_timeout_s": cfg.engine.stop_timeout_s,
            "health_interval_s": cfg.engine.health_interval_s,
            "cpus": run.cpus,
        }
        if engine.container is None:
            server = Server(run.argv, env=env, **where)
        else:
            server = _container_server(run, engine, env, where)
        run.server = server
        try:
            run.launch = await stack.enter_async_context(server)
            break
        except LaunchFailed:
            if attempt == LAUNCH_ATTEMPTS or not port_clash(server.log_lines()):
                raise
        run.clash_s += server.lifetime_s
        keep_attempt_log(run.tdir, attempt)
        run.port = free_port(cfg.engine.host)
        log.warning(
            "trial %d: a port the server binds was taken while it started (see "
            "server-attempt%d.log); launching again on port %d",
            run.number,
            attempt,
            run.port,
        )
        run.argv = trial_argv(cfg, run.params, port=run.port, baseline=run.baseline)
    assert run.launch is not None  # the loop launched or raised
    # the shared cache's index: this config's key is warm from now on (orders later launches)
    record(ctx.cache_root, compile_key(cfg, run.argv), run.launch.startup)
    if run.launch.facts.engine_version:
        ctx.engine_version = run.launch.facts.engine_version
    return server


def _container_server(
    run: ServerRun, engine: EngineConfig, env: dict[str, str], where: dict[str, Any]
) -> Server:
    """``engine.container``: the server as a foreground ``docker run`` of ``run.argv`` on the
    leased GPUs (tuner.engine.container), its id in the trial folder's ``container.id``."""
    assert engine.container is not None
    cache = run.ctx.cache_root
    if cache is not None:  # docker would create a missing mount source owned by root
        cache.mkdir(parents=True, exist_ok=True)
    cidfile = run.tdir / CIDFILE
    argv, env = wrap(
        engine,
        run.argv,
        env,
        model_path=run.cfg.model.path,
        cache_root=cache,
        gpus=run.gpus,
        cidfile=cidfile,
        name=container_name(run.ctx.study_name or "study", run.number, run.port),
        extra_env=[LEASE_ENV],
        labels={LEASE_LABEL: env[LEASE_ENV]},
    )
    log.debug("trial %d: %s", run.number, " ".join(argv))
    return ContainerServer(
        argv, program=engine.container.program, cidfile=cidfile, env=env, **where
    )


async def _replay_all(run: ServerRun, server: Server) -> None:
    """Each replay on the ready server, then its health; stop at a dead server or a prune."""
    ctx, cfg = run.ctx, run.cfg
    launch = run.launch
    assert launch is not None
    for i, rp in enumerate(run.replays):
        extra: dict[str, float] = {}
        if i:  # the previous replay warmed the caches: start this one cold
            key = api_key(cfg.engine, cfg.model)
            extra["caches_reset"] = float(await reset_caches(server.base_url, key))
        cache = launch.startup.compile_cache if launch.startup else None
        ready = f"ready in {launch.startup_s:.1f} s{f' (compile cache {cache})' if cache else ''}, "
        ready = ready if not i else ""
        log.info(
            "trial %d: %sKV cache %s tokens (predicted %s); replaying %d requests (%d warm-up)%s",
            run.number,
            ready,
            _fmt_int(launch.facts.kv_cache_tokens),
            _fmt_int(run.predicted),
            len(rp.requests),
            sum(r.warmup for r in rp.requests),
            f" [{rp.subdir}]" if rp.subdir else "",
        )
        others = ctx.pool.held - len(run.gpus)  # GPUs of trials running beside this one
        m = await measure(cfg, server.base_url, run.tdir / rp.subdir, run.gpus, rp, run.prune)
        extra["co_running_gpus"] = float(max(others, ctx.pool.held - len(run.gpus)))
        m = replace(m, telemetry={**m.telemetry, **extra})
        run.measured.append(m)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
            await server.check(http)  # the engine died: ReplayFailed, caught in run_server
        if len(run.replays) > 1:  # keep what this replay measured if a later one dies
            write_artifacts(run.tdir / rp.subdir, run.result(rp, m, None), m.records)
            run.written.add(len(run.measured) - 1)
        if m.pruned and run.prune:
            return  # lost beyond doubt: the other repeats would not change that


async def _capacity(run: ServerRun, server: Server) -> None:
    """The SLO capacity on this server (:mod:`tuner.capacity`), from the first replay on: its
    metrics go to every replay's result, its steps to ``capacity.json`` and ``capacity_K/``."""
    cfg = run.cfg
    base, first = run.replays[0], run.measured[0] if run.measured else None
    if first is None or first.pruned:  # lost at the workload's own load: the trial is PRUNED
        return
    # each step judged on every SLO (whatever objective.slo_constraints says), pruned when lost
    judged = replace(cfg.objective, slo_constraints=True, prune=True)
    probe_cfg = replace(cfg, objective=judged)
    numbers = itertools.count(1)  # the capacity_K folders; step 0 is the workload's own replay
    key = api_key(cfg.engine, cfg.model)

    async def probe(factor: float) -> Step:
        k = next(numbers)
        w = at_load(base.workload, factor)
        n = max(cfg.objective.capacity.requests or w.num_requests, MIN_STEP_REQUESTS)
        if _closed(base):  # a steady state needs several requests per slot: 3 each at least
            n = max(n, CLOSED_LOOP_REQUESTS_PER_SLOT * w.arrival.concurrency)
        w = replace(w, num_requests=n)
        requests = await asyncio.to_thread(build_requests, w, cfg.model.files)
        rp = Replay(f"capacity_{k}", requests, w)
        if not await wait_idle(server.base_url):  # a step stopped early left requests running
            log.warning("trial %d: the server was still busy 120 s after a replay", run.number)
        await reset_caches(server.base_url, key)
        log.info(
            "trial %d: capacity step %d at %.3gx the workload's load%s",
            run.number,
            k + 1,
            factor,
            f" ({w.arrival.concurrency} in flight)" if _closed(rp) else "",
        )
        m = await measure(probe_cfg, server.base_url, run.tdir / rp.subdir, run.gpus, rp, True)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
            await server.check(http)  # the engine died: ReplayFailed, caught in run_server
        write_requests(run.tdir / rp.subdir, m.records)
        return _step(_factor(base, rp, factor), rp, m, judged)

    def loads(factor: float) -> float:  # a closed loop runs a whole number of requests
        if not _closed(base):
            return factor
        c = base.workload.arrival.concurrency
        return at_load(base.workload, factor).arrival.concurrency / c

    first_step = _step(1.0, base, first, judged)
    cap = await search(probe, cfg.objective.capacity, first=first_step, loads=loads)
    run.common.update(cap.metrics())
    write_json(
        run.tdir / "capacity.json",
        {"capacity": cap.metrics(), "steps": [s.row() for s in cap.steps]},
    )
    log.info(
        "trial %d: SLO capacity %s req/s (bracket %.2f-%.2f req/s, %d replays)",
        run.number,
        f">= {cap.rps:.2f}" if cap.censored else f"{cap.rps:.2f}",
        cap.low,
        cap.high,
        len(cap.steps),
    )


def _closed(rp: Replay) -> bool:
    return is_closed_loop(rp.workload.arrival, rp.requests)


def _factor(base: Replay, rp: Replay, asked: float) -> float:
    """The load factor a replay really ran at (a closed loop's concurrency is whole)."""
    if _closed(rp):
        return rp.workload.arrival.concurrency / base.workload.arrival.concurrency
    return asked


def _step(factor: float, rp: Replay, m: Measured, objective: ObjectiveConfig) -> Step:
    """One replay as a step of the capacity search: requests/s offered (open loop: from the
    send times) or served (closed loop: by Little's law, the slots in flight over the mean E2E
    latency, steadier than completions over a short replay's span with its ramp up and down),
    the SLO margin, held or not."""
    metrics = {**m.telemetry, **summarize(m.records, rp.workload.slo)}
    rps = float(metrics.get("request_throughput", 0.0))
    sends = sorted(r.arrival_s for r in rp.requests if not r.warmup and r.arrival_s is not None)
    if not _closed(rp) and len(sends) > 1 and sends[-1] > sends[0]:
        rps = (len(sends) - 1) / (sends[-1] - sends[0])
    elif _closed(rp) and metrics.get("e2e_mean_ms"):
        rps = rp.workload.arrival.concurrency / (metrics["e2e_mean_ms"] / 1000.0)
    mg = margin(metrics, objective, rp.workload.slo)
    if m.pruned:  # lost beyond doubt, whatever the finished part says
        mg = min(mg, -0.01)
    keep = {k: metrics[k] for k in KEY_METRICS if k in metrics}
    return Step(factor, rps, mg, mg >= 0, keep, m.pruned)


def _teardown(run: ServerRun) -> None:
    """After the server stopped (its context closed): mask the server's logs, record the stop,
    release the lease (last: a tuner killed before it leaves the masking to the next run's
    recovery)."""
    if run.server is not None:
        mask_server_logs(run.tdir, run.ctx.secrets)
        run.common["stop_s"] = run.server.stop_s or 0.0
        run.common["survivors"] = float(len(run.server.survivors))
    if run.lease is not None:
        run.lease.release(lease_dir(run.cfg))


def _results(run: ServerRun) -> list[TrialResult]:
    """A result per replay, each written to its folder. A failure carries to every replay from
    the one it hit; a prune ends the replays after it without results."""
    failure, measured = run.failure, run.measured
    duration_s = round(time.monotonic() - run.t0, 3)
    results = []
    empty = Measured([], {}, None)
    for i, rp in enumerate(run.replays if failure is not None else run.replays[: len(measured)]):
        m = measured[i] if i < len(measured) else empty
        fail = failure if failure is not None and i >= len(measured) - 1 else None
        result = run.result(rp, m, fail, duration_s)
        write_artifacts(run.tdir / rp.subdir, result, None if i in run.written else m.records)
        results.append(result)
    return results


async def _wait_gpu(
    cfg: TunerConfig, params: dict[str, Any], gpus: list[int]
) -> tuple[dict[str, float], list[GpuMemory]]:
    """Before a real launch: wait (bounded) for the memory vLLM's start-up check will demand;
    the metric ``gpu_used_before_launch_gib`` and the readings (none for the simulator)."""
    if cfg.engine.kind != "vllm" or not nvml_available():
        return {}, []
    gmu = float(params.get("gpu_memory_utilization") or 0.92)
    try:
        before = gpu_memory(gpus)
        need = max(m.total_gib for m in before) * gmu + 0.5 if before else 0.0
        ok, mem = await asyncio.to_thread(
            wait_for_free_memory, gpus, need, cfg.engine.gpu_free_timeout_s
        )
    except EngineError as exc:
        log.warning("cannot read GPU memory before launch (%s); launching anyway", exc)
        return {}, []
    used = max((m.used_gib for m in mem), default=0.0)
    if not ok:
        raise LaunchFailed(
            FailureReason.GPU_BUSY,
            f"GPU memory not free after {cfg.engine.gpu_free_timeout_s:.0f} s: "
            f"{used:.1f} GiB used, need {need:.1f} GiB free for gpu_memory_utilization {gmu}",
        )
    log.info("GPUs %s: %.2f GiB used before launch", gpus, used)
    return {"gpu_used_before_launch_gib": used}, mem


async def gpu_freed(
    cfg: TunerConfig, before: list[GpuMemory], server: Server | None
) -> dict[str, float]:
    """After a real server stopped (process or container): wait, ``engine.gpu_free_timeout_s``
    at most, until each GPU of ``before`` (its readings before the launch) uses no more than it
    did then plus :data:`GPU_FREED_SLACK_GIB`; else a warning naming the container (or the
    server's process). Never fails the trial. The metric ``gpu_used_after_stop_gib``: the most
    any of them used at the end. Nothing (no NVML call) for the simulator or without readings."""
    if cfg.engine.kind != "vllm" or not before or server is None or server.proc is None:
        return {}
    ceilings = {m.index: m.used_gib + GPU_FREED_SLACK_GIB for m in before}
    timeout = cfg.engine.gpu_free_timeout_s
    if isinstance(server, ContainerServer) and server.removed is False:
        timeout = 0.0  # the container is still there: its memory will not come back
    t0 = time.monotonic()
    try:
        ok, mem = await asyncio.to_thread(wait_for_used_memory, ceilings, timeout)
    except EngineError as exc:
        log.warning("cannot read GPU memory after the server stopped: %s", exc)
        return {}
    if not mem:
        return {}
    used = max(m.used_gib for m in mem)
    if not ok:
        if isinstance(server, ContainerServer) and server.container_id:
            who = f"container {server.container_id[:12]}"
        else:
            who = f"server pid {server.proc.pid}"
        log.warning(
            "GPUs %s: %.1f GiB still used %.0f s after %s stopped (%.1f GiB before its launch); "
            "a later launch on them may find too little free memory",
            sorted(ceilings),
            used,
            time.monotonic() - t0,
            who,
            max(m.used_gib for m in before),
        )
    return {"gpu_used_after_stop_gib": used}


def _fmt_int(v: int | None) -> str:
    return f"{v:,}" if v is not None else "?"
