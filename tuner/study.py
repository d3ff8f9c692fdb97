"""The study loop: ask Optuna for params, run the trial's stages, tell Optuna, record in MLflow.

Reads as the list of stages in shared/design/ARCHITECTURE.md::

    params = space (ask) → precheck → launch → replay (+ telemetry) → score → record → teardown

A trial that cannot start or measure is *data*: it is told to Optuna as COMPLETE with its
``failed_<reason>`` constraint violated (so the sampler learns the region) and recorded in MLflow
with its ``failure_reason``. A replay stopped early because a constraint was already lost is
PRUNED. ``FAIL`` is used only for an interrupted trial or a bug in the tuner itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import statistics
import time
import warnings
import zlib
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import optuna

import tuner.replay as replay_mod
from tuner import __version__
from tuner.aio import cancel_and_wait
from tuner.config import TunerConfig, WorkloadConfig
from tuner.confirm import Candidate, ConfirmResult, judge, pick, stressed
from tuner.engine.argv import (
    api_key,
    build_env,
    cache_root,
    command_prefix,
    mask,
    mask_argv,
    secret_values,
    trial_argv,
)
from tuner.engine.logparse import port_clash
from tuner.engine.pool import GpuPool, core_ranges, cpu_layout, describe_cores, on_cores
from tuner.engine.process import Server, free_port
from tuner.errors import (
    ConfigError,
    EngineError,
    FailureReason,
    LaunchFailed,
    ReplayFailed,
    TrialFailed,
)
from tuner.memory import ModelShape
from tuner.precheck import precheck
from tuner.prescreen import prescreen
from tuner.records import LaunchInfo, RequestRecord, RequestSpec, TrialResult, to_json
from tuner.recovery import LEASE_ENV, Lease, recover, worker_id
from tuner.replay import ClientStats, loop_factory, replay
from tuner.report import changed_params, gpu_time, live_best, print_summary, progress_line
from tuner.score import constraints, failure_values, objective_values, prune_reason, summarize
from tuner.space import defaults, defaults_outside, distributions, grid, resolved
from tuner.telemetry.gpu import GpuSampler, gpu_memory, nvml_available, wait_for_free_memory
from tuner.telemetry.prom import MetricsScraper
from tuner.tracking import NullTracker, Tracker, open_tracker
from tuner.workload import build_requests

__all__ = ["StudyOutcome", "run"]

log = logging.getLogger("tuner")

LAUNCH_ATTEMPTS = 3
"""Launches of one trial's server when a port it binds is taken while it starts (not the config's
fault: a server starting beside it, or another program, got the port first)."""


@dataclass
class StudyOutcome:
    study: optuna.Study
    results: list[TrialResult] = field(default_factory=list)
    interrupted: bool = False
    confirmed: list[ConfirmResult] = field(default_factory=list)


@dataclass
class _Ctx:
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

    @property
    def lease_dir(self) -> Path:
        return _lease_dir(self.cfg)


def _lease_dir(cfg: TunerConfig) -> Path:
    return Path(cfg.paths.state_dir) / "leases"


def study_name(cfg: TunerConfig) -> str:
    return cfg.study.name or f"{cfg.workload.name}-{cfg.model.name}"


def _sampler(cfg: TunerConfig, n_existing: int) -> optuna.samplers.BaseSampler:
    # A resumed study, or a second worker on the same study, must not replay the same random
    # start-up points: the seed is offset by the stored trials and by this worker's identity.
    seed = cfg.study.seed + n_existing + zlib.crc32(worker_id().encode()) % 65_536
    s = cfg.study.sampler
    if s == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s == "gp":
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise ConfigError(
                "study.sampler=gp needs PyTorch (Optuna's GPSampler); pip install torch"
            )
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=cfg.study.n_startup_trials)
    if s == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if s == "grid":
        return optuna.samplers.GridSampler(grid(cfg.space), seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=cfg.study.n_startup_trials)


T = TypeVar("T")


def _retry_schema_race(make: Callable[[], T], what: str, attempts: int = 6) -> T:
    """``make()``, retried when a database is being initialised by another worker at the same
    moment (two tuners starting on one fresh PostgreSQL database race to create the schema)."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    for attempt in range(attempts):
        try:
            return make()
        except (SQLAlchemyError, MlflowException) as exc:
            if attempt == attempts - 1:
                raise
            log.info("%s is being initialised by another worker (%s); retrying", what, exc)
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


def storage_url(cfg: TunerConfig) -> str:
    """``study.storage``, or SQLite under ``paths.state_dir``."""
    return cfg.study.storage or f"sqlite:///{Path(cfg.paths.state_dir) / 'optuna.db'}"


def open_study(cfg: TunerConfig) -> optuna.Study:
    Path(cfg.paths.state_dir).mkdir(parents=True, exist_ok=True)
    storage = storage_url(cfg)
    name = study_name(cfg)
    directions = [o.direction for o in cfg.objective.objectives]
    n_existing = 0
    with contextlib.suppress(KeyError):
        n_existing = len(
            _retry_schema_race(
                lambda: optuna.load_study(study_name=name, storage=storage), "Optuna storage"
            ).trials
        )
    try:
        study = _retry_schema_race(
            lambda: optuna.create_study(
                study_name=name,
                storage=storage,
                directions=directions,  # type: ignore[arg-type]  # validated: maximize|minimize
                sampler=_sampler(cfg, n_existing),
                load_if_exists=True,
            ),
            "Optuna storage",
        )
    except ValueError as exc:
        raise ConfigError(f"study {name!r} exists with other objectives: {exc}") from exc
    if [d.name.lower() for d in study.directions] != directions:
        raise ConfigError(
            f"study {name!r} in {storage} was created with directions "
            f"{[d.name.lower() for d in study.directions]}; this run asks for {directions}; "
            "set study.name to start a new study"
        )
    with warnings.catch_warnings():  # set_metric_names is "experimental" since Optuna 3.2
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([o.metric for o in cfg.objective.objectives])
    for key, value in (("workload", cfg.workload.name), ("model", cfg.model.name)):
        study.set_user_attr(key, value)
    return study


def run(cfg: TunerConfig) -> StudyOutcome:
    """Run ``cfg.study.n_trials`` more trials of the study ``cfg`` names."""
    run_dir = Path(cfg.paths.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    dists = distributions(cfg.space)
    for entry in cfg.study.enqueue:  # checked before the study is created or changed
        unknown = sorted(set(entry) - set(dists))
        if unknown:
            raise ConfigError(f"study.enqueue names {unknown}, not searched params {sorted(dists)}")
    study = open_study(cfg)
    n_stored = len(study.trials)
    # what a killed tuner left behind, first: a trial it was running is FAIL from here on
    for note in recover(study, _lease_dir(cfg)):
        log.warning("recovered: %s", note)
    if cfg.study.baseline_first and not _has_baseline(study):  # new, or interrupted before
        outside = defaults_outside(cfg.space)
        if outside and not n_stored:
            log.warning(
                "no baseline trial: vLLM's default of %s is outside the searched range",
                ", ".join(outside),
            )
        elif not outside:
            study.enqueue_trial(defaults(cfg.space), user_attrs={"baseline": True})
            if n_stored:
                log.info(
                    "the baseline trial (vLLM's defaults) has not finished yet; enqueued again"
                )
    if cfg.study.warm_start:
        _warm_start(study, cfg, dists)
    for entry in cfg.study.enqueue:
        _enqueue_once(study, {**defaults(cfg.space), **entry})
    requests = build_requests(cfg.workload, Path(cfg.model.path))
    shape = ModelShape.from_dir(cfg.model.path)
    if cfg.study.prescreen.trials and "prescreen" not in study.user_attrs:
        _prescreen(study, cfg, shape, requests)
    # study.repeats: the other request streams, built here, not while trials replay
    repeat_requests = [
        build_requests(replace(cfg.workload, seed=cfg.workload.seed + k), Path(cfg.model.path))
        for k in range(1, cfg.study.repeats)
    ]
    secrets = secret_values(cfg.engine, model=cfg.model)
    for saved in run_dir.glob(".hydra/*.yaml"):  # Hydra's copy of the command line and config
        _mask_file(saved, secrets)
    cache_dir = cache_root(cfg)
    tracker = _retry_schema_race(
        lambda: open_tracker(
            cfg.tracking.enabled,
            cfg.tracking.uri,
            cfg.tracking.experiment or study.study_name,
            run_dir.name,
            _tags(cfg),
            lambda s: mask(s, secrets),
        ),
        "MLflow store",
    )
    own: list[int] = []  # engine.cpu_pinning: the tuner's cores, and each server's
    servers_cores: dict[int, list[int]] | None = None
    if cfg.engine.cpu_pinning:
        own, servers_cores = cpu_layout(cfg.engine.gpus, cfg.engine.cpu_reserve)
    ctx = _Ctx(
        cfg,
        shape,
        requests,
        secrets,
        run_dir,
        cache_dir,
        study_name=study.study_name,
        parent_run_id=tracker.parent_run_id,
        pool=GpuPool(cfg.engine.gpus),
        repeat_requests=repeat_requests,
        cpu_sets=servers_cores,
    )
    outcome = StudyOutcome(study)
    log.info(
        "study %s: %d trials stored, running %d more (%s engine, model %s, workload %s, %d "
        "requests/trial); run dir %s",
        study.study_name,
        n_stored,
        cfg.study.n_trials,
        cfg.engine.kind,
        cfg.model.name,
        cfg.workload.name,
        sum(not r.warmup for r in requests),
        run_dir,
    )
    status = "FINISHED"
    try:
        with on_cores(own) as cores:
            if own:
                _note_own_cores(cfg, cores, ctx.cpu_sets or {})
            _run_on_loop(cfg, _trials(study, dists, ctx, tracker, outcome))
            print_summary(outcome, cfg)
            _after_search(study, ctx, tracker, outcome)
    except KeyboardInterrupt:
        outcome.interrupted = True
        status = "KILLED"
        log.warning("interrupted: running trials are marked FAIL; stored trials are kept")
        raise
    finally:
        tracker.finish(status, _parent_summary(outcome))
    return outcome


def _note_own_cores(cfg: TunerConfig, cores: list[int], servers: dict[int, list[int]]) -> None:
    """``engine.cpu_pinning``: say where the tuner and the servers run; warn when the replay
    client has more processes than the cores kept for it."""
    log.info("engine.cpu_pinning: %s", describe_cores(cores, servers))
    procs = cfg.workload.client_processes
    if procs > len(cores):
        log.warning(
            "workload.client_processes=%d shares engine.cpu_reserve=%d cores with the tuner: "
            "raise engine.cpu_reserve to %d or more so each client process has a core",
            procs,
            len(cores),
            procs + 1,
        )


async def _trials(
    study: optuna.Study,
    dists: dict[str, optuna.distributions.BaseDistribution],
    ctx: _Ctx,
    tracker: Tracker | NullTracker,
    outcome: StudyOutcome,
) -> None:
    """Run ``study.n_trials`` trials, ``study.n_workers`` at a time, each on its own GPU lease.

    A trial is asked for only when a worker is free, so the sampler sees the running ones
    (TPE's constant liar). Blocking tracking calls run in a thread so they do not stall the
    replays of trials still measuring. A config rejected before launch is told to Optuna like
    any trial (the sampler learns the infeasible region from it) but, up to
    ``study.max_rejected`` of them, does not count toward ``n_trials``: it cost no GPU time.
    """
    cfg = ctx.cfg
    n = cfg.study.n_trials
    free_limit = cfg.study.max_rejected
    slots = asyncio.Semaphore(cfg.study.n_workers)
    finished = 0  # counted trials finished
    free = 0  # configs rejected before launch that did not count
    t_start = time.monotonic()

    async def one(trial: optuna.Trial) -> None:
        nonlocal finished, free
        baseline = bool(trial.user_attrs.get("baseline", False))
        try:
            result = await _run_trial(ctx, trial.number, dict(trial.params), baseline)
        except (KeyboardInterrupt, asyncio.CancelledError):
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        except Exception as exc:  # a bug in the tuner itself: FAIL, and stop loudly
            trial.set_user_attr("tuner_error", repr(exc)[:1000])
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        finally:
            slots.release()
        # no await between the release above and this: the asking loop sees the new count
        not_counted = result.rejected_before_launch and free < free_limit
        if not_counted:
            free += 1
        last_free = not_counted and free == free_limit
        _tell(study, trial, result, cfg)
        await asyncio.to_thread(_record, tracker, result, ctx)
        outcome.results.append(result)
        if not_counted:
            log.info(progress_line(result, None, n, cfg))
            if last_free:
                log.warning(
                    "the precheck has rejected %d configs in this run (study.max_rejected); "
                    "further rejections count toward study.n_trials. Most of the space cannot "
                    "start: narrow space.params, or see the failure reasons above",
                    free_limit,
                )
            return
        finished += 1
        elapsed = time.monotonic() - t_start
        eta = elapsed / finished * (n - finished)
        log.info(progress_line(result, finished, n, cfg))
        log.info("  %s | elapsed %s, ETA %s", live_best(study, cfg), _hms(elapsed), _hms(eta))

    tasks: list[asyncio.Task[None]] = []  # one per trial asked for

    def counted() -> int:  # trials asked for that count toward n
        return len(tasks) - free

    try:
        while True:
            await slots.acquire()
            if any(t.done() and t.exception() for t in tasks):
                break  # a trial hit a tuner bug: stop asking, report it below
            if counted() >= n:
                # enough asked; a running one may still be rejected and hand its place back
                slots.release()
                running = [t for t in tasks if not t.done()]
                if not running:
                    break
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                continue
            budget = cfg.study.timeout_s
            if budget is not None and time.monotonic() - t_start >= budget:
                slots.release()
                log.info(
                    "study.timeout_s (%g s) has passed: no new trial after %d of %d; the "
                    "running ones finish, and the same command continues the study",
                    budget,
                    counted(),
                    n,
                )
                break
            trial = study.ask(dists)
            trial.set_user_attr("worker", worker_id())
            tasks.append(asyncio.create_task(one(trial)))
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _confirm(ctx: _Ctx, candidates: list[Candidate]) -> list[ConfirmResult]:
    """Each candidate on one server, one stress replay per seed, one candidate at a time (so no
    co-running trial biases the numbers that decide the recommendation)."""
    cfg = ctx.cfg
    cc = cfg.confirm
    out = []
    for i, c in enumerate(candidates, 1):
        replays = []
        for seed in cc.seeds:
            w = stressed(cfg.workload, cc, seed)
            replays.append(_Replay(f"seed_{seed}", build_requests(w, Path(cfg.model.path)), w))
        log.info(
            "confirm %d/%d: trial %d (%s) at %gx load, %gx duration, seeds %s",
            i,
            len(candidates),
            c.trial,
            ", ".join(c.picks),
            cc.load_factor,
            cc.duration_factor,
            list(cc.seeds),
        )
        tdir = ctx.run_dir / "confirm" / f"trial_{c.trial:04d}"
        runs = await _run_server(ctx, c.trial, c.params, c.baseline, tdir, replays, prune=False)
        verdict = judge(c, list(zip(cc.seeds, runs, strict=True)), cfg.objective)
        held = "holds" if verdict.passed else f"DEMOTED: {verdict.reason}"
        log.info("confirm: trial %d %s", c.trial, held)
        out.append(verdict)
    return out


def _confirmed_before(study: optuna.Study, cfg: TunerConfig) -> dict[int, ConfirmResult]:
    """Verdicts stored by an earlier run with the same stress settings, by trial."""
    from tuner.report import stored_confirm

    data = study.user_attrs.get("confirm")
    stored = stored_confirm(data)
    if stored is None or not isinstance(data, dict):  # the second narrows data's type
        return {}
    same = (
        data.get("load_factor") == cfg.confirm.load_factor
        and data.get("duration_factor") == cfg.confirm.duration_factor
        and data.get("seeds") == list(cfg.confirm.seeds)
    )
    return {r.trial: r for r in stored[1]} if same else {}


def _after_search(
    study: optuna.Study, ctx: _Ctx, tracker: Tracker | NullTracker, outcome: StudyOutcome
) -> None:
    """Confirm the picks under stress, then publish (exports, figures, MLflow tags)."""
    from tuner.report import publish, store_confirm

    cfg = ctx.cfg
    if not any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
        return
    others = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        if t.user_attrs.get("worker") != worker_id()
    ]
    if others and cfg.confirm.enabled:  # many workers on one study: the last one confirms
        log.info(
            "confirm left to the worker(s) still running trials %s",
            sorted({str(t.user_attrs.get("worker")) for t in others}),
        )
    elif (
        cfg.confirm.enabled
        and cfg.confirm.seeds
        and (candidates := pick(study, cfg.objective, cfg.confirm.picks))
    ):
        done = _confirmed_before(study, cfg)  # a resumed study: do not stress a trial twice
        todo = [c for c in candidates if c.trial not in done]
        if done and len(todo) < len(candidates):
            log.info("confirm: reusing the stored verdicts of trials %s", sorted(set(done)))
        fresh = _run_on_loop(cfg, _confirm(ctx, todo)) if todo else []
        results = [done[c.trial] if c.trial in done else fresh.pop(0) for c in candidates]
        results = [replace(r, picks=c.picks) for r, c in zip(results, candidates, strict=True)]
        store_confirm(study, candidates, results, cfg)
        outcome.confirmed = results
    try:
        publish(study, cfg, ctx.run_dir, tracker)
    except Exception as exc:  # a report must never cost the study
        log.warning("could not publish the results: %s", exc)


def _warm_start(
    study: optuna.Study, cfg: TunerConfig, dists: dict[str, optuna.distributions.BaseDistribution]
) -> None:
    """Enqueue the Pareto-best feasible configs of another study (once: :func:`_enqueue_once`)."""
    storage = storage_url(cfg)
    try:
        source = optuna.load_study(study_name=cfg.study.warm_start, storage=storage)
    except KeyError as exc:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise ConfigError(
            f"study.warm_start {cfg.study.warm_start!r} is not in {storage}; have: {names}"
        ) from exc
    best = source.best_trials
    for t in best:
        params = {
            k: v
            for k, v in t.params.items()
            if k in dists and dists[k]._contains(dists[k].to_internal_repr(v))
        }
        _enqueue_once(study, {**defaults(cfg.space), **params})
    log.info(
        "warm start: enqueued %d Pareto-best configs of study %s", len(best), source.study_name
    )


_LIVE = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.WAITING,
)
"""States of a trial that has run, runs or will run; a FAIL (interrupted, tuner bug) has not."""


def _same_params(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        w = b[k]
        if isinstance(v, bool) or isinstance(w, bool) or not isinstance(v, int | float):
            if v != w:
                return False
        elif not isinstance(w, int | float) or not math.isclose(float(v), float(w), rel_tol=1e-9):
            return False
    return True


def _run_on_loop(cfg: TunerConfig, coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the event loop of ``workload.client_loop``."""
    with asyncio.Runner(loop_factory=loop_factory(cfg.workload.client_loop)) as runner:
        return runner.run(coro)


def _enqueue_once(
    study: optuna.Study, params: dict[str, Any], user_attrs: dict[str, Any] | None = None
) -> bool:
    """Enqueue ``params`` unless a trial with them has run, runs or waits. Unlike Optuna's
    ``skip_if_exists``, a FAIL trial (one a killed or interrupted tuner left) does not count, so
    the same command runs an interrupted enqueued config again."""
    for t in study.get_trials(deepcopy=False, states=_LIVE):
        if _same_params(params, t.system_attrs.get("fixed_params", t.params)):
            return False
    study.enqueue_trial(params, user_attrs=user_attrs)
    return True


def _prescreen(
    study: optuna.Study, cfg: TunerConfig, shape: ModelShape, requests: list[RequestSpec]
) -> None:
    """Enqueue the simulator's best configs (:mod:`tuner.prescreen`), once per study: the study
    records that it ran, so a resumed study does not repeat it."""
    picks, summary = prescreen(cfg, shape, requests)
    added = 0
    for choice in picks:
        added += _enqueue_once(
            study,
            {**defaults(cfg.space), **choice.params},
            user_attrs={"prescreen": choice.predicted},
        )
    study.set_user_attr("prescreen", {**summary, "enqueued": added})


def _has_baseline(study: optuna.Study) -> bool:
    return any(t.user_attrs.get("baseline") for t in study.get_trials(deepcopy=False, states=_LIVE))


def _tags(cfg: TunerConfig) -> dict[str, str]:
    return {
        "tuner.study": study_name(cfg),
        "engine": cfg.engine.kind,
        "model": cfg.model.name,
        "workload": cfg.workload.name,
        "tuner.version": __version__,
        "optuna.version": optuna.__version__,
    }


def _parent_summary(outcome: StudyOutcome) -> dict[str, float]:
    ok = [r for r in outcome.results if r.ok and not r.pruned]
    return {
        "trials_run": float(len(outcome.results)),
        "trials_ok": float(len(ok)),
        "trials_failed": float(sum(not r.ok for r in outcome.results)),
        "trials_pruned": float(sum(bool(r.pruned) for r in outcome.results)),
        **gpu_time(outcome.results),
    }


def _tell(study: optuna.Study, trial: optuna.Trial, result: TrialResult, cfg: TunerConfig) -> None:
    for key, value in result.constraints.items():
        trial.set_constraint(key, value)
    attrs: dict[str, Any] = {
        "metrics": result.metrics,
        "failure_reason": result.failure_reason,
        "failure_detail": result.failure_detail,
        "predicted_kv_tokens": result.predicted_kv_tokens,
        "launched": result.launched,
        "server_s": result.server_s,
        "pruned": result.pruned,
        "gpus": list(result.gpus),
        "argv": list(result.argv),
        "serve_args": list(result.argv[len(command_prefix(cfg.engine)) :]),
        "trial_dir": str(_trial_dir(Path(cfg.paths.output_dir), result.number).resolve()),
    }
    if result.launch is not None:
        attrs["kv_cache_tokens"] = result.launch.facts.kv_cache_tokens
        attrs["startup_s"] = result.launch.startup_s
        attrs["engine_version"] = result.launch.facts.engine_version
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    if result.pruned:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return
    values = result.values if result.values is not None else failure_values(cfg.objective)
    study.tell(trial, list(values))


def _record(tracker: Tracker | NullTracker, result: TrialResult, ctx: _Ctx) -> None:
    tags = {"vllm.version": ctx.engine_version or "unknown"}
    try:
        tracker.log_trial(result, _trial_dir(ctx.run_dir, result.number), tags)
    except Exception as exc:  # tracking must never lose the study: log and go on
        log.error("MLflow logging of trial %d failed: %s", result.number, exc)


def _trial_dir(run_dir: Path, number: int) -> Path:
    return run_dir / f"trial_{number:04d}"


# --- one trial --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Replay:
    """One request stream replayed on a launched server; its artifacts go to ``subdir``."""

    subdir: str
    requests: list[RequestSpec]
    workload: WorkloadConfig


async def _run_trial(ctx: _Ctx, number: int, params: dict[str, Any], baseline: bool) -> TrialResult:
    """The trial's server, with ``study.repeats`` replays on it; one result (their mean)."""
    w = ctx.cfg.workload
    replays = [_Replay("", ctx.requests, w)]
    for k, reqs in enumerate(ctx.repeat_requests, 1):
        replays.append(_Replay(f"repeat_{k + 1}", reqs, replace(w, seed=w.seed + k)))
    tdir = _trial_dir(ctx.run_dir, number)
    results = await _run_server(ctx, number, params, baseline, tdir, replays, prune=True)
    if len(replays) == 1:
        return results[0]
    result = mean_result(results, ctx.cfg)
    (tdir / "repeats.json").write_text(
        json.dumps([{"repeat": i + 1, **r.metrics} for i, r in enumerate(results)], indent=2) + "\n"
    )
    (tdir / "result.json").write_text(to_json(result, indent=2) + "\n")
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


async def _run_server(
    ctx: _Ctx,
    number: int,
    params: dict[str, Any],
    baseline: bool,
    tdir: Path,
    replays: list[_Replay],
    *,
    prune: bool,
) -> list[TrialResult]:
    """Precheck, launch one server with ``params``, run each replay on it, stop it: a result per
    replay. A failure ends the server's replays: the one it hit and those after it carry it."""
    cfg = ctx.cfg
    t0 = time.monotonic()
    started_at = time.time()
    leased: list[int] = []
    _mkdir(tdir)
    full = resolved(cfg.space, params)
    port = free_port(cfg.engine.host)
    argv = trial_argv(cfg, params, port=port, baseline=baseline)
    shown_argv = tuple(mask_argv(argv, ctx.secrets))
    launch: LaunchInfo | None = None
    measured: list[tuple[list[RequestRecord], dict[str, float], str | None]] = []
    common: dict[str, float] = {}
    failure: TrialFailed | None = None
    server: Server | None = None
    lease: Lease | None = None
    predicted: int | None = None
    all_requests = [r for rp in replays for r in rp.requests]
    records_written: set[int] = set()  # replays whose requests.jsonl is on disk already
    clash_s = 0.0  # server time of launches lost to a port taken in the meantime

    def info() -> _RunInfo:
        return _RunInfo(
            number=number,
            params=full,
            argv=shown_argv,
            launch=launch,
            predicted=predicted,
            baseline=baseline,
            launched=server is not None,
            server_s=(server.lifetime_s if server is not None else 0.0) + clash_s,
            gpus=tuple(leased),
            started_at=started_at,
            duration_s=round(time.monotonic() - t0, 3),
        )

    try:
        verdict = precheck(
            cfg, ctx.shape, full, all_requests, baseline=baseline, veto=cfg.study.precheck
        )
        predicted = verdict.kv_tokens
        tp = int(full.get("tensor_parallel_size") or 1)
        async with ctx.pool.lease(tp) as gpus:
            leased = gpus
            common.update(await _wait_gpu(cfg, full, gpus))
            lease = Lease.create(
                ctx.lease_dir,
                ctx.study_name,
                number,
                ctx.parent_run_id,
                cfg.tracking.uri if cfg.tracking.enabled else None,
            )
            engine = replace(cfg.engine, gpus=gpus)  # CUDA_VISIBLE_DEVICES = the lease
            cpus = sorted({c for g in gpus for c in ctx.cpu_sets[g]}) if ctx.cpu_sets else None
            if cpus:
                common["cpus_pinned"] = float(len(cpus))
                common["client_cpus"] = float(len(os.sched_getaffinity(0)))
            env = {**build_env(engine, cache_root=ctx.cache_root), LEASE_ENV: lease.id}
            log.info(
                "trial %d: launching on GPU %s%s with %s",
                number,
                gpus,
                f" (CPUs {core_ranges(cpus)})" if cpus else "",
                changed_params(params, cfg),
            )
            stack = contextlib.AsyncExitStack()
            for attempt in range(1, LAUNCH_ATTEMPTS + 1):
                server = Server(
                    argv,
                    env=env,
                    log_path=tdir / "server.log",
                    host=cfg.engine.host,
                    port=port,
                    startup_timeout_s=cfg.engine.startup_timeout_s,
                    stop_timeout_s=cfg.engine.stop_timeout_s,
                    health_interval_s=cfg.engine.health_interval_s,
                    cpus=cpus,
                )
                try:
                    launch = await stack.enter_async_context(server)
                    break
                except LaunchFailed:
                    if attempt == LAUNCH_ATTEMPTS or not port_clash(server.log_lines()):
                        raise
                clash_s += server.lifetime_s
                _keep_attempt_log(tdir, attempt)
                port = free_port(cfg.engine.host)
                log.warning(
                    "trial %d: a port the server binds was taken while it started (see "
                    "server-attempt%d.log); launching again on port %d",
                    number,
                    attempt,
                    port,
                )
                argv = trial_argv(cfg, params, port=port, baseline=baseline)
                shown_argv = tuple(mask_argv(argv, ctx.secrets))
            assert server is not None and launch is not None  # the loop launched or raised
            async with stack:
                if launch.facts.engine_version:
                    ctx.engine_version = launch.facts.engine_version
                for i, rp in enumerate(replays):
                    extra: dict[str, float] = {}
                    if i:  # the previous replay warmed the caches: start this one cold
                        extra["caches_reset"] = float(
                            await _reset_caches(server.base_url, api_key(cfg.engine, cfg.model))
                        )
                    ready = f"ready in {launch.startup_s:.1f} s, " if not i else ""
                    log.info(
                        "trial %d: %sKV cache %s tokens (predicted %s); replaying %d requests "
                        "(%d warm-up)%s",
                        number,
                        ready,
                        _fmt_int(launch.facts.kv_cache_tokens),
                        _fmt_int(predicted),
                        len(rp.requests),
                        sum(r.warmup for r in rp.requests),
                        f" [{rp.subdir}]" if rp.subdir else "",
                    )
                    others = ctx.pool.held - len(gpus)  # GPUs of trials running beside this one
                    records, telemetry, pruned = await _measure(
                        ctx, server, tdir / rp.subdir, gpus, rp, prune
                    )
                    extra["co_running_gpus"] = float(max(others, ctx.pool.held - len(gpus)))
                    measured.append((records, {**telemetry, **extra}, pruned))
                    async with aiohttp.ClientSession(
                        timeout=aiohttp.ClientTimeout(total=3)
                    ) as http:
                        await server.check(http)  # the engine died: ReplayFailed, caught below
                    if len(replays) > 1:  # keep what this replay measured if a later one dies
                        done = _replay_result(
                            ctx, rp, records, {**common, **measured[-1][1]}, pruned, None, info()
                        )
                        _write_artifacts(tdir / rp.subdir, done, records)
                        records_written.add(len(measured) - 1)
                    if pruned and prune:
                        break  # lost beyond doubt: the other repeats would not change that
    except TrialFailed as exc:
        failure = exc
    finally:
        if lease is not None:
            lease.release(ctx.lease_dir)
        if server is not None:
            common["stop_s"] = server.stop_s or 0.0
            common["survivors"] = float(len(server.survivors))
            _mask_server_logs(tdir, ctx.secrets)
    run = info()
    results = []
    # a failure carries to every replay; a prune ends the replays after it without results
    for i, rp in enumerate(replays if failure is not None else replays[: len(measured)]):
        records, telemetry, pruned = measured[i] if i < len(measured) else ([], {}, None)
        fail = failure if failure is not None and i >= len(measured) - 1 else None
        result = _replay_result(ctx, rp, records, {**common, **telemetry}, pruned, fail, run)
        _mkdir(tdir / rp.subdir)
        _write_artifacts(tdir / rp.subdir, result, None if i in records_written else records)
        results.append(result)
    return results


@dataclass(frozen=True)
class _RunInfo:
    """What the results of every replay on one server share."""

    number: int
    params: dict[str, Any]
    argv: tuple[str, ...]
    launch: LaunchInfo | None
    predicted: int | None
    baseline: bool
    launched: bool
    server_s: float
    gpus: tuple[int, ...]
    started_at: float
    duration_s: float


def _replay_result(
    ctx: _Ctx,
    rp: _Replay,
    records: list[RequestRecord],
    measured: dict[str, float],
    pruned: str | None,
    fail: TrialFailed | None,
    run: _RunInfo,
) -> TrialResult:
    """One replay's :class:`TrialResult` (``measured``: the server's and the replay's telemetry)."""
    cfg = ctx.cfg
    metrics = {**measured, **summarize(records, rp.workload.slo)}
    if fail is not None:
        pruned = None
    elif records and metrics["error_rate"] >= 1.0:
        first = next((r.error for r in records if r.error), None)
        fail = ReplayFailed(FailureReason.REPLAY_ERRORS, first or "all requests failed")
        pruned = None
    reason = fail.reason.value if fail else None
    return TrialResult(
        number=run.number,
        params=run.params,
        argv=run.argv,
        values=None if fail is not None else objective_values(metrics, cfg.objective),
        constraints=constraints(metrics, reason, cfg.objective, rp.workload.slo),
        metrics=metrics,
        failure_reason=reason,
        failure_detail=mask(fail.detail, ctx.secrets) if fail else None,
        launch=run.launch,
        predicted_kv_tokens=run.predicted,
        baseline=run.baseline,
        launched=run.launched,
        server_s=run.server_s,
        pruned=pruned,
        gpus=run.gpus,
        started_at=run.started_at,
        duration_s=run.duration_s,
    )


async def _reset_caches(base_url: str, key: str | None) -> bool:
    """POST vLLM's ``/reset_prefix_cache`` and ``/reset_mm_cache`` (mounted only when the server
    runs with ``VLLM_SERVER_DEV_MODE=1``); True if both answered 200."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    ok = True
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for path in ("/reset_prefix_cache", "/reset_mm_cache"):
            try:
                async with http.post(base_url + path, headers=headers) as resp:
                    ok = ok and resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
    if not ok:
        log.info("  caches not reset (the server needs VLLM_SERVER_DEV_MODE=1 for that)")
    return ok


async def _wait_gpu(
    cfg: TunerConfig, params: Mapping[str, Any], gpus: list[int]
) -> dict[str, float]:
    """Before a real launch: wait (bounded) for the memory vLLM's start-up check will demand."""
    if cfg.engine.kind != "vllm" or not nvml_available():
        return {}
    gmu = float(params.get("gpu_memory_utilization") or 0.92)
    try:
        before = gpu_memory(gpus)
        need = max(m.total_gib for m in before) * gmu + 0.5 if before else 0.0
        ok, mem = await asyncio.to_thread(
            wait_for_free_memory, gpus, need, cfg.engine.gpu_free_timeout_s
        )
    except EngineError as exc:
        log.warning("cannot read GPU memory before launch (%s); launching anyway", exc)
        return {}
    used = max((m.used_gib for m in mem), default=0.0)
    if not ok:
        raise LaunchFailed(
            FailureReason.GPU_BUSY,
            f"GPU memory not free after {cfg.engine.gpu_free_timeout_s:.0f} s: "
            f"{used:.1f} GiB used, need {need:.1f} GiB free for gpu_memory_utilization {gmu}",
        )
    log.info("GPUs %s: %.2f GiB used before launch", gpus, used)
    return {"gpu_used_before_launch_gib": used}


async def _measure(
    ctx: _Ctx, server: Server, tdir: Path, gpus: list[int], rp: _Replay, prune: bool
) -> tuple[list[RequestRecord], dict[str, float], str | None]:
    """Replay with telemetry beside it; stop early (pruned) once a constraint is lost."""
    cfg = ctx.cfg
    w = rp.workload
    _mkdir(tdir)
    total = len(rp.requests)
    n_measured = sum(not r.warmup for r in rp.requests)
    step = max(1, total // 4)
    done: list[RequestRecord] = []
    lost = asyncio.Event()
    why: list[str] = []

    def on_record(r: RequestRecord) -> None:
        done.append(r)
        if len(done) % step == 0 and len(done) < total:
            log.info("  replay %d/%d requests", len(done), total)
        if prune and not r.warmup and not lost.is_set():
            reason = prune_reason(done, n_measured, cfg.objective, w.slo)
            if reason:
                why.append(reason)
                lost.set()

    client = ClientStats()
    with GpuSampler(gpus if cfg.engine.kind == "vllm" else [], 0.5) as gpu:
        async with MetricsScraper(server.base_url, interval_s=1.0) as prom:
            task = asyncio.create_task(
                replay(
                    server.base_url,
                    cfg.model.served_name,
                    rp.requests,
                    w.arrival,
                    duration_s=w.duration_s,
                    request_timeout_s=w.request_timeout_s,
                    api_key=api_key(cfg.engine, cfg.model),
                    on_record=on_record,
                    processes=w.client_processes,
                    client_loop=w.client_loop,
                    stats=client,
                )
            )
            watch = asyncio.create_task(lost.wait())
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            watch.cancel()
            if task.done():
                records = task.result()
                pruned = None
            else:  # pruned: keep what finished, drop what was in flight
                await cancel_and_wait(task)
                records = list(done)
                pruned = why[0]
                log.info("  pruned after %d requests: %s", len(records), pruned)
    _write_jsonl(tdir / "metrics.jsonl", prom.samples)
    _write_jsonl(tdir / "gpu.jsonl", gpu.samples)
    own = client.summary()
    _warn_client_lag(own, w.client_processes, w.client_loop)
    return records, {**prom.summary(), **gpu.summary(), **own}, pruned


def _warn_client_lag(own: dict[str, float], processes: int, client_loop: str) -> None:
    lag = own.get("client_lag_p99_ms")
    if lag is None or lag <= replay_mod.CLIENT_LAG_WARN_MS:
        return
    hint = f"raise workload.client_processes (now {processes})"
    if client_loop == "asyncio":
        hint += " or try workload.client_loop=uvloop"
    log.warning(
        "  the replay client was busy: its event loop ran %.1f ms late at p99 (max %.1f ms, "
        "busiest client process at %.0f%% CPU), so TTFT/ITL include up to that much of the "
        "client's own delay; %s",
        lag,
        own.get("client_lag_max_ms", lag),
        100 * own.get("client_cpu_max", 0.0),
        hint,
    )


def _hms(seconds: float) -> str:
    m, sec = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _mkdir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _fmt_int(v: int | None) -> str:
    return f"{v:,}" if v is not None else "?"


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _write_artifacts(tdir: Path, result: TrialResult, records: list[RequestRecord] | None) -> None:
    """``result.json``, and ``requests.jsonl`` unless ``records`` is None (written before)."""
    if records is not None:
        with (tdir / "requests.jsonl").open("w") as f:
            for r in records:
                f.write(to_json(r) + "\n")
    (tdir / "result.json").write_text(to_json(result, indent=2) + "\n")


def _keep_attempt_log(tdir: Path, attempt: int) -> None:
    """The log of a launch that is retried, kept beside the next one's ``server.log``."""
    (tdir / "server.log").replace(tdir / f"server-attempt{attempt}.log")


def _mask_server_logs(tdir: Path, secrets: list[str]) -> None:
    for path in (tdir / "server.log", *sorted(tdir.glob("server-attempt*.log"))):
        _mask_file(path, secrets)


def _mask_file(path: Path, secrets: list[str]) -> None:
    if not secrets or not path.is_file():
        return
    text = path.read_text(errors="replace")
    masked = mask(text, secrets)
    if masked != text:
        path.write_text(masked)
