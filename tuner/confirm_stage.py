"""The confirm stage's servers (``tuner/study.py`` runs it after the search): each pick and vLLM's
defaults once per round on a fresh server under stress, stored as each ends, judged at the end
(:meth:`tuner.confirm_stop.EarlyStop.result`); the verdict is :func:`tuner.confirm.conclude`'s.
"""

from __future__ import annotations

import logging

import optuna

from tuner.artifacts import trial_dir
from tuner.compile_cache import warm_first
from tuner.confirm import capacity_start, stressed
from tuner.confirm_stop import EarlyStop
from tuner.deadline import Deadline
from tuner.engine.argv import params_key
from tuner.measure import Replay
from tuner.quality_guard import Guard
from tuner.records import Candidate, ConfirmResult, TrialResult
from tuner.score import needs_capacity
from tuner.stored_study import ConfirmRuns
from tuner.trial import TrialContext, run_server
from tuner.workload import build_requests

__all__ = ["run_confirm"]

log = logging.getLogger("tuner")


async def run_confirm(
    study: optuna.Study, ctx: TrialContext, candidates: list[Candidate], deadline: Deadline
) -> list[ConfirmResult] | None:
    """Every candidate once per round (``confirm.rounds``), interleaved (A, B, defaults, A, B,
    defaults, ...) so a drift of the machine hits them alike, each run on a fresh server with one
    stress replay per seed; one server at a time (no co-running trial biases the numbers that
    decide the recommendation); within a round, candidates whose compile key is warm first. A
    run's folder, ``confirm/trial_NNNN/round_R/seed_S/``, is written as soon as it ends, and its
    results are stored in the study (:class:`~tuner.stored_study.ConfirmRuns`): the same command
    after an interruption runs only the servers not stored (those with an eval replay again). A
    candidate that changes numerics, and the defaults, replay the eval set on each server after
    its stress replays (:mod:`tuner.quality_guard`), and are judged on it too. Which candidate
    runs no more rounds: :class:`tuner.confirm_stop.EarlyStop` (its two stops). None where
    ``study.deadline_s`` leaves no room for the next server: no verdict until every one has run."""
    cfg, root = ctx.cfg, ctx.cache_root
    cc = cfg.confirm
    replays = []
    for seed in cc.seeds:  # the same stress streams in every round and for every candidate
        w = stressed(cfg.workload, cc, seed)
        replays.append(Replay(f"seed_{seed}", build_requests(w, cfg.model.files), w))
    runs: dict[int, list[tuple[int, int, TrialResult]]] = {c.trial: [] for c in candidates}
    guard = Guard(cfg, candidates)  # the eval replays of picks that change numerics
    key = ConfirmRuns.digest([r.workload for r in replays], cfg.objective, cc.load_factor)
    stored = ConfirmRuns.of(study, key)  # servers an earlier run of this stage finished
    log.info(
        "confirm: %d candidate(s) x %d round(s), each on a fresh server: %d server starts at %gx "
        "load, %gx duration, seeds %s", len(candidates), cc.rounds, len(candidates) * cc.rounds,
        cc.load_factor, cc.duration_factor, list(cc.seeds),
    )  # fmt: skip
    if (intro := guard.intro()) is not None:
        log.info(intro)
    step, total = 0, len(candidates) * cc.rounds
    early = EarlyStop(cfg, candidates, stored, guard)
    for rnd in range(1, cc.rounds + 1):  # within a round the order is free: warm keys first
        for c in warm_first(candidates, lambda c: params_key(cfg, c.params, c.baseline), root):
            step += 1
            if early.skip(c, rnd, runs, f"confirm {step}/{total}"):
                continue
            after = guard.hook(c, rnd)  # the eval replay, if this pick is judged on quality
            kept = None if after is not None else stored.get(c.trial, rnd)
            log.info(
                "confirm %d/%d: round %d, trial %d (%s)%s", step, total,
                rnd, c.trial, ", ".join(c.picks), " stored by an earlier run" if kept else "",
            )  # fmt: skip
            if kept is not None:  # a server that ended before this stage was cut short
                runs[c.trial] += [(rnd, seed, r) for seed, r in kept]
                continue
            if (late := deadline.check(study)) is not None:
                log.warning(
                    "confirm: %s: stopped before server %d of %d; no verdict until every server "
                    "has run: the same command runs the rest", late, step, total,
                )  # fmt: skip
                return None
            tdir = trial_dir(ctx.run_dir / "confirm", c.trial) / f"round_{rnd}"
            earlier = [r for _, _, r in runs[c.trial]]  # its servers of earlier rounds
            start = capacity_start(c, cfg, earlier) if needs_capacity(cfg.objective) else None
            run, since = (ctx, c.trial, c.params, c.baseline, tdir, replays), deadline.now()
            got = await run_server(*run, prune=False, capacity_start=start, after=after)
            deadline.timed(since)
            stored.put(study, c.trial, rnd, list(zip(cc.seeds, got, strict=True)))
            runs[c.trial] += [(rnd, seed, r) for seed, r in zip(cc.seeds, got, strict=True)]
            failed = sorted({r.failure_reason for r in got if r.failure_reason})
            if failed:
                log.info("confirm: trial %d failed in round %d: %s", c.trial, rnd, failed)
    out = []
    for c in candidates:
        judged = early.result(c, runs[c.trial])
        held = "holds" if judged.passed else f"DEMOTED: {judged.reason}"
        log.info("confirm: trial %d %s", c.trial, held)
        out.append(judged)
    return out
