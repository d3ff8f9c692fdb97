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

import contextlib
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from tuner.artifacts import (
    TrialFolder,
    keep_attempt_log,
    make_dir,
    mask_server_logs,
    trial_dir,
    write_artifacts,
    write_repeats,
)
from tuner.capacity import Start, for_gpus
from tuner.capacity_probe import probe_capacity
from tuner.compile_cache import record
from tuner.config import EngineConfig, ObjectiveConfig, TunerConfig
from tuner.engine.argv import api_key, build_env, compile_key, mask, mask_argv, trial_argv
from tuner.engine.container import CIDFILE, container_name, container_server
from tuner.engine.gpu_memory import gpu_freed, wait_free_memory
from tuner.engine.logparse import port_clash
from tuner.engine.pool import GpuPool, core_ranges, gpus_per_server
from tuner.engine.process import Preload, Server, free_port
from tuner.errors import FailureReason, LaunchFailed, ReplayFailed, TrialFailed
from tuner.measure import Measured, Replay, measure, reset_caches
from tuner.memory import ModelShape
from tuner.precheck import precheck, with_fixed
from tuner.quality_guard import screen_hook
from tuner.records import LaunchInfo, RequestSpec, TrialResult
from tuner.recovery import LEASE_ENV, Lease, lease_dir
from tuner.score import constraints, mean_result, needs_capacity, objective_values, summarize
from tuner.space import changed_params, resolved
from tuner.startup import ready_note
from tuner.telemetry.gpu import GpuMemory, machine_of

__all__ = [
    "LAUNCH_ATTEMPTS",
    "ServerFactory",
    "ServerRun",
    "TrialContext",
    "carried_failure",
    "launch_server",
    "run_server",
    "run_trial",
]

log = logging.getLogger("tuner")

LAUNCH_ATTEMPTS = 3
"""Launches of one trial's server when a port it binds is taken while it starts (not the config's
fault: a server starting beside it, or another program, got the port first)."""


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
    start_server: ServerFactory = field(default_factory=lambda: launch_server)
    """Makes each launch's server (:func:`launch_server`; the unit tests pass an in-process
    one)."""


async def run_trial(
    ctx: TrialContext,
    number: int,
    params: dict[str, Any],
    baseline: bool,
    incumbent: Start | None = None,
) -> TrialResult:
    """The trial's server, with ``study.repeats`` replays on it; one result (their mean).
    ``incumbent``: the study's best capacity as a load factor, probed first (:mod:`capacity`)."""
    w = ctx.cfg.workload
    replays = [Replay("", ctx.requests, w)]
    for k, reqs in enumerate(ctx.repeat_requests, 1):
        replays.append(Replay(f"repeat_{k + 1}", reqs, replace(w, seed=w.seed + k)))
    tdir = trial_dir(ctx.run_dir, number)
    results = await run_server(
        ctx, number, params, baseline, tdir, replays, prune=True, capacity_start=incumbent
    )
    if len(replays) == 1:
        return results[0]
    result = mean_result(results, ctx.cfg.objective, ctx.cfg.workload.slo)
    write_repeats(tdir, results, result)
    return result


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
    capacity_start: Start | None = None
    """The load factor the capacity search tries after the first replay (None: it doubles); a
    loss there ends a search trial's search (``prune``: the incumbent probe)."""

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
        self, rp: Replay, m: Measured, fail: TrialFailed | None, duration_s: float | None = None
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
            machine=machine_of(self.gpu_before),
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
    capacity_start: Start | None = None,
    after: Callable[[str], Awaitable[None]] | None = None,
) -> list[TrialResult]:
    """Precheck, launch one server with ``params``, run each replay on it, stop it: a result per
    replay. A failure ends the server's replays: the one it hit and those after it carry it.
    ``capacity_start``: the capacity search's first load after the first replay (ServerRun);
    ``after``: awaited with the server's URL before it stops (the confirm's quality replay; in
    a screen, :func:`tuner.quality_guard.screen_hook`'s)."""
    cfg = ctx.cfg
    make_dir(tdir)
    after = after if after is not None else screen_hook(cfg, params, baseline, tdir)
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
        capacity_start=capacity_start,
    )
    try:
        _precheck(run)
        need = gpus_per_server(with_fixed(cfg, run.full, baseline=baseline))  # TP x DP
        async with ctx.pool.lease(need) as gpus:
            run.gpus = gpus
            try:
                await _prepare(run)
                async with contextlib.AsyncExitStack() as stack:
                    server = await _launch(run, stack)
                    await _replay_all(run, server)
                    if needs_capacity(cfg.objective):
                        await _capacity(run, server)
                    if after is not None:
                        await after(server.base_url)
            except TrialFailed as exc:
                run.failure = exc
            # the server stopped: its memory released before the GPUs go back to the pool
            run.common.update(await gpu_freed(cfg.engine, run.gpu_before, run.server))
    except TrialFailed as exc:
        run.failure = exc
    finally:
        _teardown(run)
    return _results(run)


def _precheck(run: ServerRun) -> None:
    """Refuse what certainly cannot start (raises :class:`TrialFailed`), and keep the memory
    model's KV prediction."""
    cfg, requests = run.cfg, [r for rp in run.replays for r in rp.requests]
    kw = {"baseline": run.baseline, "veto": cfg.study.precheck}
    run.predicted = precheck(cfg, run.ctx.shape, run.full, requests, **kw).kv_tokens


async def _prepare(run: ServerRun) -> None:
    """On the leased GPUs: wait for their memory, write the lease file, choose the CPU cores."""
    ctx, cfg = run.ctx, run.cfg
    metrics, run.gpu_before = await wait_free_memory(cfg.engine, run.full, run.gpus)
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
        "trial %d: launching on GPU %s%s%s with %s",
        run.number,
        run.gpus,
        " (simulated)" if cfg.engine.kind == "sim" else "",
        f" (CPUs {core_ranges(run.cpus)})" if run.cpus else "",
        changed_params(run.params, cfg.space),
    )
    for attempt in range(1, LAUNCH_ATTEMPTS + 1):
        server = ctx.start_server(run, engine, env)
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
            "server-attempt%d.log); launching again on port %d", run.number, attempt, run.port
        )  # fmt: skip
        run.argv = trial_argv(cfg, run.params, port=run.port, baseline=run.baseline)
    assert run.launch is not None  # the loop launched or raised
    # the shared cache's index: this config's key is warm from now on (orders later launches)
    record(ctx.cache_root, compile_key(cfg, run.argv), run.launch.startup)
    if run.launch.facts.engine_version:
        ctx.engine_version = run.launch.facts.engine_version
    return server


ServerFactory = Callable[["ServerRun", EngineConfig, dict[str, str]], Server]
"""Makes the server of one launch of ``run`` (``engine``: the config with the leased GPUs,
``env``: its environment); entering it starts the server and waits until it is ready."""


def launch_server(run: ServerRun, engine: EngineConfig, env: dict[str, str]) -> Server:
    """The server of ``run.argv`` on ``run.port``, logging to the trial folder's ``server.log``:
    a process (:class:`Server`), or with ``engine.container`` a foreground ``docker run`` of it
    on the leased GPUs (tuner.engine.container), its id in the trial folder's ``container.id``."""
    where: dict[str, Any] = {
        "log_path": TrialFolder(run.tdir).server_log,
        "host": engine.host,
        "port": run.port,
        "startup_timeout_s": engine.startup_timeout_s,
        "stop_timeout_s": engine.stop_timeout_s,
        "health_interval_s": engine.health_interval_s,
        "cpus": run.cpus,
    }
    if engine.container is None:
        zygote_log = run.ctx.run_dir / "zygote.log"  # the lease's marker differs per launch too
        preload = Preload.of(engine, zygote_log, LEASE_ENV) if engine.preload else None
        return Server(run.argv, env=env, preload=preload, **where)
    return container_server(
        engine,
        run.argv,
        env,
        model_path=run.cfg.model.path,
        cache_root=run.ctx.cache_root,
        gpus=run.gpus,
        cidfile=run.tdir / CIDFILE,
        name=container_name(run.ctx.study_name or "study", run.number, run.port),
        lease_env=LEASE_ENV,
        **where,
    )


async def _replay_all(run: ServerRun, server: Server) -> None:
    """Each replay on the ready server, then its health; stop at a dead server or a prune."""
    ctx, cfg = run.ctx, run.cfg
    launch = run.launch
    assert launch is not None
    ready = ready_note(launch, simulated=cfg.engine.kind == "sim")  # said by the first replay
    for i, rp in enumerate(run.replays):
        extra: dict[str, float] = {}
        if i:  # the previous replay warmed the caches: start this one cold
            key = api_key(cfg.engine, cfg.model)
            extra["caches_reset"] = float(await reset_caches(server.base_url, key))
        log.info(
            "trial %d: %sKV cache %s tokens (predicted %s); replaying %d requests (%d warm-up)%s",
            run.number,
            "" if i else ready,
            _fmt_int(launch.facts.kv_cache_tokens),
            _fmt_int(run.predicted),
            len(rp.requests),
            sum(r.warmup for r in rp.requests),
            f" [{rp.subdir}]" if rp.subdir else "",
        )
        others = ctx.pool.held - len(run.gpus)  # GPUs of trials running beside this one
        judge = cfg.objective if run.prune else None
        m = await measure(cfg, server.base_url, run.tdir / rp.subdir, run.gpus, rp, judge)
        extra["co_running_gpus"] = float(max(others, ctx.pool.held - len(run.gpus)))
        m = replace(m, telemetry={**m.telemetry, **extra})
        run.measured.append(m)
        await _alive(server)
        if len(run.replays) > 1:  # keep what this replay measured if a later one dies
            write_artifacts(run.tdir / rp.subdir, run.result(rp, m, None), m.records)
            run.written.add(len(run.measured) - 1)
        if m.pruned and run.prune:
            return  # lost beyond doubt: the other repeats would not change that


async def _capacity(run: ServerRun, server: Server) -> None:
    """The SLO capacity on this server (:mod:`tuner.capacity_probe`), from the first replay on:
    its metrics go to every replay's result, its steps to ``capacity.json`` and
    ``capacity_K/``."""
    cfg = run.cfg
    first = run.measured[0] if run.measured else None
    if first is None or first.pruned:  # lost at the workload's own load: the trial is PRUNED
        return

    async def step(path: Path, rp: Replay, judged: ObjectiveConfig, top: float | None) -> Measured:
        return await measure(cfg, server.base_url, path, run.gpus, rp, judged, top)

    cap = await probe_capacity(
        run.number,
        cfg.objective,
        run.replays[0],
        first,
        base_url=server.base_url,
        folder=TrialFolder(run.tdir),
        model_files=cfg.model.files,
        api_key=api_key(cfg.engine, cfg.model),
        measure=step,
        check=functools.partial(_alive, server),
        start=for_gpus(run.capacity_start, len(run.gpus)),
        stop_on_loss=run.prune,  # with an incumbent to lose to (capacity.search)
    )
    run.common.update(cap.metrics(gpus=len(run.gpus)))


async def _alive(server: Server) -> None:
    """Return if the engine is alive; else :class:`ReplayFailed`, caught in :func:`run_server`."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        await server.check(http)


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
        fail = carried_failure(failure, i, len(measured))
        result = run.result(rp, m, fail, duration_s)
        write_artifacts(run.tdir / rp.subdir, result, None if i in run.written else m.records)
        results.append(result)
    return results


F = TypeVar("F")


def carried_failure(failure: F | None, i: int, n_measured: int) -> F | None:
    """The failure replay ``i`` carries when the server's replays ended with ``failure`` after
    ``n_measured`` replays were measured: the replay it hit (the last one measured: the health
    check after it failed; the first if none was) and every one after it; None before it.

    >>> [carried_failure("engine_dead", i, 2) for i in range(4)]
    [None, 'engine_dead', 'engine_dead', 'engine_dead']
    """
    return failure if failure is not None and i >= n_measured - 1 else None


def _fmt_int(v: int | None) -> str:
    return f"{v:,}" if v is not None else "?"
