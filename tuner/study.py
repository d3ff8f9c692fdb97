"""The orchestrator: prepare the study, run the ask/tell loop, then the after-search stage.

::

    prepare   storage.open_study → recovery.recover → storage.fill_queue (baseline, warm start,
              enqueue, prescreen) → tracking.open_tracker
    search    ask (space) → trial.run_trial: precheck → launch → measure → teardown
              → stored_trial.tell (Optuna) → tracking (MLflow) → console.progress_line
    after     confirm_stage.run_confirm (the picks re-run under stress) → confirm.conclude
              → stored_study.ConfirmRecord.store → publish.publish

Each stage lives in its own module; this one only sequences them. A trial that cannot start or
measure is *data*: it is told to Optuna as COMPLETE with its ``failed_<reason>`` constraint
violated (so the sampler learns the region) and recorded in MLflow with its ``failure_reason``. A
replay stopped early because a constraint was already lost is PRUNED. ``FAIL`` is used only for an
interrupted trial (``failure_reason`` ``interrupted``, and a FAILED MLflow child run) or a bug in
the tuner itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna

from tuner import __version__, aio, screen, stored_trial
from tuner.artifacts import trial_dir
from tuner.config import TunerConfig
from tuner.confirm import conclude, pick
from tuner.confirm_stage import run_confirm
from tuner.console import hms, live_best, parent_summary, print_summary, progress_line
from tuner.deadline import Deadline
from tuner.engine.argv import cache_root, check_command, fixed_note, mask, secret_values
from tuner.engine.pool import GpuPool, cpu_layout, on_cores
from tuner.grid import grid_left
from tuner.measure import note_client_cores
from tuner.memory import ModelShape
from tuner.publish import publish
from tuner.records import ConfirmResult, TrialResult
from tuner.recovery import close_runs, lease_dir, recover, worker_id
from tuner.replay_client import loop_factory
from tuner.space import distributions
from tuner.storage import (
    check_enqueue,
    fill_queue,
    mark_baseline,
    open_study,
    retry_schema_race,
    storage_url,
    study_name,
    trial_start,
)
from tuner.stored_study import ConfirmRecord
from tuner.stored_trial import mark_interrupted, mark_tuner_error, mark_worker, tell
from tuner.stores import check_tracking, hide_url, quick_tracking_retries
from tuner.study_lock import prepare_lock
from tuner.tracking import WORKER, NullTracker, Tracker, open_tracker
from tuner.trial import TrialContext, run_trial
from tuner.workload import build_requests

__all__ = ["StudyOutcome", "run"]

log = logging.getLogger("tuner")


WAITING = optuna.trial.TrialState.WAITING
STOPPED = "the tuner was stopped (Ctrl-C or SIGTERM) while this trial ran"
"""The ``failure_detail`` of a trial interrupted in this process."""


@dataclass
class StudyOutcome:
    study: optuna.Study
    results: list[TrialResult] = field(default_factory=list)
    interrupted: bool = False
    stopped: list[tuple[int, dict[str, Any], str]] = field(default_factory=list)
    """Trials interrupted before they ended (number, params, how): FAIL, ``interrupted``."""
    confirmed: list[ConfirmResult] = field(default_factory=list)


def run(cfg: TunerConfig) -> StudyOutcome:
    """Run ``cfg.study.n_trials`` more trials of the study ``cfg`` names.

    Every input is read and checked before the storage is opened or anything is written: the
    engine command, the enqueued configs, the model directory, the request streams (a trace's
    rows); a :class:`~tuner.errors.ConfigError` here leaves no study and no trial folder."""
    deadline = Deadline(cfg.study.deadline_s)  # the window starts with the invocation
    check_command(cfg.engine)
    dists = distributions(cfg.space)
    check_enqueue(cfg, dists)  # before the study is created or changed
    shape = ModelShape.from_dir(cfg.model.files)
    requests = build_requests(cfg.workload, cfg.model.files)
    # study.repeats: the other request streams, built here, not while trials replay
    repeat_requests = [
        build_requests(replace(cfg.workload, seed=cfg.workload.seed + k), cfg.model.files)
        for k in range(1, cfg.study.repeats)
    ]
    if cfg.tracking.enabled:  # a tracking server that is down: one line now, not at trial 1
        check_tracking(cfg.tracking.uri)
        quick_tracking_retries(cfg.tracking.uri)  # one that goes away later: seconds a call
    study = open_study(cfg)
    n_stored = len(study.trials)
    run_dir = Path(cfg.paths.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    secrets = secret_values(cfg.engine, model=cfg.model)
    # a killed tuner's leftovers first (its trial is FAIL from here on), one worker at a time
    url = storage_url(cfg)  # SQLite: one host's file, so other hosts' trials are dead
    with prepare_lock(url, study.study_name):  # two at once would both enqueue a baseline
        recovered = recover(study, lease_dir(cfg), secrets, moved=url.startswith("sqlite"))
        for note in recovered.notes:
            log.warning("recovered: %s", note)
        if cfg.mode == "screen":  # the lever screen: its fixed trials only, no sampled one
            cfg = screen.prepare(study, cfg)  # its space: the choices the study stored
        else:
            fill_queue(study, cfg, dists, shape, requests, n_stored)
    cache_dir = cache_root(cfg)
    tracker = retry_schema_race(
        lambda: open_tracker(
            cfg.tracking.enabled,
            cfg.tracking.uri,
            cfg.tracking.experiment or study.study_name,
            run_dir.name,
            _tags(cfg),
            lambda s: mask(s, secrets),
        ),
        f"MLflow store {hide_url(cfg.tracking.uri)}",
    )
    # MLflow's side of the recovery, once the store's schema exists: the dead tuner's
    # interrupted trials as child runs, and the runs it left RUNNING closed
    experiment = cfg.tracking.experiment or study.study_name
    uri = cfg.tracking.uri if cfg.tracking.enabled else None
    for note in close_runs(recovered, study.study_name, uri, experiment):
        log.warning("recovered: %s", note)
    own: list[int] = []  # engine.cpu_pinning: the tuner's cores, and each server's
    servers_cores: dict[int, list[int]] | None = None
    if cfg.engine.cpu_pinning:
        own, servers_cores = cpu_layout(cfg.engine.gpus, cfg.engine.cpu_reserve)
    ctx = TrialContext(
        cfg, shape, requests, secrets, run_dir, cache_dir, study_name=study.study_name,
        parent_run_id=tracker.parent_run_id, pool=GpuPool(cfg.engine.gpus),
        repeat_requests=repeat_requests, cpu_sets=servers_cores,
    )  # fmt: skip
    outcome = StudyOutcome(study)
    log.info(
        "study %s: %d trials stored, running %d more (%s engine, model %s, workload %s, %d "
        "requests/trial%s); run dir %s", study.study_name, n_stored, cfg.study.n_trials,
        cfg.engine.kind, cfg.model.name, cfg.workload.name, sum(not r.warmup for r in requests),
        fixed_note(cfg.model), run_dir,
    )  # fmt: skip
    status, reason = "FINISHED", None
    try:
        with on_cores(own) as cores:
            if own:
                note_client_cores(cfg, cores, ctx.cpu_sets or {}, requests)
            loop = loop_factory(cfg.workload.client_loop)
            trials = _trials(study, distributions(cfg.space), ctx, tracker, outcome, deadline)
            aio.run(trials, loop)
            print_summary(outcome.study, outcome.results, cfg)
            _after_search(study, ctx, tracker, outcome, deadline)
    except BaseException as exc:  # Ctrl-C or SIGTERM (KeyboardInterrupt), or a tuner bug
        outcome.interrupted = isinstance(exc, KeyboardInterrupt)
        if outcome.interrupted:
            status, reason = "KILLED", "interrupted (Ctrl-C or SIGTERM)"
            log.warning("interrupted: running trials are marked FAIL; stored trials are kept")
        else:
            status = "FAILED"
        for number, params, detail in outcome.stopped:
            _record_stopped(tracker, number, params, detail, ctx)
        raise
    finally:
        tracker.finish(status, parent_summary(outcome.results), reason)
    return outcome


async def _trials(
    study: optuna.Study,
    dists: dict[str, optuna.distributions.BaseDistribution],
    ctx: TrialContext,
    tracker: Tracker | NullTracker,
    outcome: StudyOutcome,
    deadline: Deadline,
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

    untold: dict[int, optuna.Trial] = {}  # asked, not told yet
    why = STOPPED  # how a trial still running is interrupted

    def stop(trial: optuna.Trial) -> None:  # interrupted: FAIL, with the reason
        if untold.pop(trial.number, None) is not None:
            try:
                mark_interrupted(study, trial, why)
            except Exception as exc:  # said, not lost in the cancelled tasks' gather
                log.error(
                    "could not mark trial %d interrupted (%r): it stays RUNNING until the next "
                    "run's recovery marks it", trial.number, exc,
                )  # fmt: skip
            outcome.stopped.append((trial.number, dict(trial.params), why))

    async def one(trial: optuna.Trial) -> None:
        nonlocal finished, free
        baseline = mark_baseline(trial, cfg)
        since = deadline.now()
        # the study's best capacity (the baseline's: a prediction), else a warm start's or the sim's
        incumbent = await trial_start(study, cfg, ctx.shape, ctx.requests, trial.params, baseline)
        try:
            result = await run_trial(ctx, trial.number, dict(trial.params), baseline, incumbent)
        except (KeyboardInterrupt, asyncio.CancelledError):
            stop(trial)
            raise
        except Exception as exc:  # a bug in the tuner itself: FAIL, and stop loudly
            untold.pop(trial.number, None)
            mark_tuner_error(trial, exc)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        finally:
            slots.release()
        untold.pop(trial.number, None)
        # no await between the release above and this: the asking loop sees the new count
        if not result.rejected_before_launch:
            deadline.timed(since)
        not_counted = result.rejected_before_launch and free < free_limit
        if not_counted:
            free += 1
        last_free = not_counted and free == free_limit
        tell(study, trial, result, cfg, trial_dir(ctx.run_dir, result.number))
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
        log.info("  %s | elapsed %s, ETA %s", live_best(study, cfg), hms(elapsed), hms(eta))

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
            if (late := deadline.check(study)) is not None:
                slots.release()
                log.info("%s: no new trial after %d of %d; the same command continues the study",
                         late, counted(), n)  # fmt: skip
                break
            end = screen.round_end(study, cfg, time.monotonic() - t_start)
            if end == "end":
                slots.release()
                break
            n += end == "defaults_next"  # a defaults' server put first: the queued keep theirs
            if grid_left(study, cfg) == 0 and not study.get_trials(states=(WAITING,)):
                slots.release()
                log.info("study=grid: every cell of the grid has run; no new trial")
                break
            trial = study.ask(dists)
            untold[trial.number] = trial
            mark_worker(trial, worker_id())
            tasks.append(asyncio.create_task(one(trial)))
        await asyncio.gather(*tasks)
    except BaseException as exc:
        if isinstance(exc, Exception):  # a trial hit a tuner bug: the others stop with it
            why = f"the study stopped on a tuner error in another trial: {exc!r}"[:1000]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for trial in list(untold.values()):  # a task cancelled before it ran at all
            stop(trial)
        raise


def _after_search(
    study: optuna.Study,
    ctx: TrialContext,
    tracker: Tracker | NullTracker,
    outcome: StudyOutcome,
    deadline: Deadline,
) -> None:
    """Confirm the picks under stress, then publish (exports, figures, MLflow tags)."""
    cfg = ctx.cfg
    if not any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
        return
    others = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        if stored_trial.worker(t) != worker_id()
    ]
    if others and cfg.confirm.enabled:  # many workers on one study: the last one confirms
        log.info(
            "confirm left to the worker(s) still running trials %s",
            sorted({stored_trial.worker(t) for t in others}),
        )
    elif (
        cfg.confirm.enabled
        and cfg.confirm.seeds
        and (candidates := pick(study, cfg.objective, cfg.confirm.picks))
    ):
        record = ConfirmRecord.from_study(study)  # a resumed study: do not stress a trial twice
        done = record.reusable(cfg.confirm) if record is not None else {}
        todo = [c for c in candidates if c.trial not in done]
        if done and len(todo) < len(candidates):
            log.info("confirm: reusing the stored verdicts of trials %s", sorted(set(done)))
        loop = loop_factory(cfg.workload.client_loop)
        fresh = aio.run(run_confirm(study, ctx, todo, deadline), loop) if todo else []
        if fresh is not None:  # None: study.deadline_s came first
            results = [done[c.trial] if c.trial in done else fresh.pop(0) for c in candidates]
            results = [replace(r, picks=c.picks) for r, c in zip(results, candidates, strict=True)]
            conclude(study, candidates, results, cfg).store(study)
            outcome.confirmed = results
    try:
        publish(study, cfg, ctx.run_dir, tracker)
    except Exception as exc:  # a report must never cost the study
        log.warning("could not publish the results: %s", exc)


def _record(tracker: Tracker | NullTracker, result: TrialResult, ctx: TrialContext) -> None:
    tags = {"vllm.version": ctx.engine_version or "unknown"}
    if changed := stored_trial.numerics_of(ctx.cfg, result):  # the quality guard's business
        tags["changes_numerics"] = ",".join(changed)
    try:
        tracker.log_trial(result, trial_dir(ctx.run_dir, result.number), tags)
    except Exception as exc:  # tracking must never lose the study: log and go on
        log.error("MLflow logging of trial %d failed: %s", result.number, exc)


def _record_stopped(
    tracker: Tracker | NullTracker,
    number: int,
    params: dict[str, Any],
    detail: str,
    ctx: TrialContext,
) -> None:
    """An interrupted trial's FAILED child run (``failure_reason`` ``interrupted``)."""
    try:
        tracker.log_interrupted(number, params, detail, trial_dir(ctx.run_dir, number))
    except Exception as exc:  # tracking must never lose the study: log and go on
        log.error("MLflow logging of interrupted trial %d failed: %s", number, exc)


def _tags(cfg: TunerConfig) -> dict[str, str]:
    return {
        WORKER: worker_id(),
        "tuner.study": study_name(cfg),
        "engine": cfg.engine.kind,
        "model": str(cfg.model.name),
        "workload": cfg.workload.name,
        "tuner.version": __version__,
        "optuna.version": optuna.__version__,
    }
