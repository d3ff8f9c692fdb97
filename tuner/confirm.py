"""Stage 8 — confirm: the best configs of the search, re-run longer and harder before deploying.

Every hand-tuning guide ends with a stress test; this is it. :func:`pick` chooses the candidates
from the finished study (max goodput within SLO, lowest latency, the knee of the Pareto front,
vLLM's defaults as the reference, ...); the study loop runs every candidate once per round
(``confirm.rounds``, interleaved: A, B, defaults, A, B, defaults, ...), each run on a fresh server
with one stress replay per seed on the workload :func:`stressed` makes (``confirm.load_factor`` ×
concurrency or rate, ``confirm.duration_factor`` × requests and time, other request orders).
:func:`judge` keeps the worst case of a candidate's runs and demotes it if a run failed, errored
past the budget or missed an SLO, with the reason; :func:`verdict` asks :mod:`tuner.verdict`
whether a pick's gain over the defaults beats the spread between rounds (with what the quality
guard found, :mod:`tuner.quality_guard`: a pick that changes numerics and answers worse than the
defaults is demoted in :mod:`tuner.study`'s confirm loop), :func:`conclude` makes
the record the study stores (:class:`tuner.stored_study.ConfirmRecord`), :func:`current_verdict`
reads it back as the study stands now, and :func:`recommended` names the config to deploy.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import optuna

from tuner import stored_trial
from tuner.capacity import Start
from tuner.config import CONFIRM_PICKS, ConfirmConfig, ObjectiveConfig, TunerConfig, WorkloadConfig
from tuner.quality_guard import note
from tuner.records import Candidate, ConfirmResult, TrialResult
from tuner.score import KEY_METRICS, capacity_metric
from tuner.stored_study import ConfirmRecord, baseline_trial
from tuner.verdict import Arm, Verdict, decide

__all__ = [
    "SEARCH_ONLY",
    "PICKS",
    "Standing",
    "capacity_start",
    "conclude",
    "current_verdict",
    "judge",
    "median_crossing",
    "pick",
    "recommended",
    "round_machines",
    "round_values",
    "stressed",
    "verdict",
]

log = logging.getLogger("tuner")

PICKS = CONFIRM_PICKS

SEARCH_ONLY = ("capacity_factor", "capacity_factor_high", "capacity_censored")
"""Kept of a candidate's search (when measured), not of its stress runs: where its confirm
servers start the capacity search (:func:`capacity_start`), and whether it was censored. Not
shown as results (the exports' headers leave them out, :mod:`tuner.publish`)."""

# "higher is better" for these, lower for the rest (of KEY_METRICS, reported for every run)
_HIGHER = {"goodput", "output_throughput", "request_throughput", "success_rate"}


def _latency_metric(objective: ObjectiveConfig) -> str:
    for o in objective.objectives:
        if o.direction == "minimize":
            return o.metric
    return f"ttft_p{objective.slo_percentile}_ms"


def _knee(
    study: optuna.Study, feasible: Sequence[optuna.trial.FrozenTrial]
) -> optuna.trial.FrozenTrial:
    """The Pareto-best trial closest to the utopia point after min-max scaling each objective."""
    if len(study.directions) == 1:
        sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
        return max(feasible, key=lambda t: (sign * t.values[0], -t.number))
    front = [t for t in study.best_trials if stored_trial.feasible(t)]
    if len(front) <= 1:
        return front[0] if front else feasible[0]
    signs = [1.0 if d == optuna.study.StudyDirection.MAXIMIZE else -1.0 for d in study.directions]
    scaled = [[s * v for s, v in zip(signs, t.values, strict=True)] for t in front]
    cols = list(zip(*scaled, strict=True))
    lo = [min(c) for c in cols]
    hi = [max(c) for c in cols]

    def gap(t: optuna.trial.FrozenTrial) -> float:
        return math.sqrt(
            sum(
                ((h - s * v) / (h - low) if h > low else 0.0) ** 2
                for s, v, low, h in zip(signs, t.values, lo, hi, strict=True)
            )
        )

    return min(front, key=lambda t: (gap(t), t.number))


def pick(study: optuna.Study, objective: ObjectiveConfig, picks: Sequence[str]) -> list[Candidate]:
    """The trials each pick names, among feasible completed ones (merged when the same trial)."""
    feasible = [t for t in study.trials if stored_trial.feasible(t)]
    if not feasible:
        return []
    chosen: dict[int, list[str]] = {}
    latency = _latency_metric(objective)
    for name in picks:
        if name == "knee":
            t = _knee(study, feasible)
        elif name == "baseline":
            # measured, feasible or not: the reference the picks' gains are measured against
            base = baseline_trial(study, which="measured")
            if base is None:
                continue
            t = base
        else:
            metric, best = {
                "capacity": (capacity_metric(objective) or "capacity_rps", max),
                "goodput": ("goodput", max),
                "throughput": ("output_throughput", max),
                "latency": (latency, min),
            }[name]
            have = [t for t in feasible if stored_trial.metric(t, metric) is not None]
            if name == "capacity":  # a capacity censored above is an estimate under a loss
                have = [t for t in have if (stored_trial.metric(t, "capacity_censored") or 0) >= 0]
            if not have:
                continue
            t = best(have, key=lambda t, m=metric: (stored_trial.metric(t, m), -t.number))  # type: ignore[misc]
        chosen.setdefault(t.number, []).append(name)
    by_number = {t.number: t for t in study.trials}
    out = []
    for number, names in chosen.items():
        t = by_number[number]
        out.append(
            Candidate(
                trial=number,
                picks=tuple(names),
                params=dict(t.params),
                baseline=stored_trial.is_baseline(t),
                serve_args=stored_trial.serve_args(t),
                search_metrics={
                    m: v
                    for m in (*_reported(objective), *SEARCH_ONLY)
                    if (v := stored_trial.metric(t, m)) is not None
                },
            )
        )
    return out


def capacity_start(
    candidate: Candidate, cfg: TunerConfig, earlier: Sequence[TrialResult] = ()
) -> Start | None:
    """Where a confirm server's capacity search starts: at the candidate's search capacity, as
    a load factor on the stressed workload (``confirm.load_factor`` × the workload's load),
    ``near`` (:attr:`tuner.capacity.Start.near`: from there it walks by narrow steps, up after a
    hold, down after a loss, so the first crossing closes the bracket), or None without one (it
    doubles from the stressed load, as a search trial's first did). In the simulator's quick
    start under ``objective=capacity`` (2026-12-04, speed-up 8, 9 servers), started one narrow
    climb under the capacity, a server whose start failed narrowed from the stressed load far
    below and one that held with a wide margin jumped past the capacity: 4-7 replays a server,
    6.0 on average. A pick whose capacity was censored above starts between its estimate and
    the load where it lost.

    ``earlier``: the pick's confirm servers that ran before this one (earlier rounds, also those
    a cut-short run stored). Once one of them bracketed a capacity on the same stressed stream,
    the next starts at theirs (the median crossing), not the search's: the search server read on
    another stream (``workload.seed``, 3 % apart on the simulator) and a censored pick's start is
    a guess. In the quick start of 2026-12-05 a latency pick censored in the search started
    each of its 3 servers at 2.43x, lost there and one narrow step below, and took 5 replays
    each to measure 63.0-63.5 req/s (2.23x-2.33x); from the first server's crossing a server
    needs 3 (the stress replay, a hold, a loss). A start moves a capacity by less than the
    spread between fresh servers (``tests/integration/test_capacity_study.py``); each server
    still brackets its own crossing, up or down from there."""
    crossed = median_crossing(r.metrics for r in earlier if not r.failure_reason)
    if crossed is not None:
        return crossed
    factor = candidate.search_metrics.get("capacity_factor")
    if factor is None or factor <= 0:
        return None
    rps = candidate.search_metrics.get("capacity_rps")
    top = candidate.search_metrics.get("capacity_factor_high")
    if candidate.search_metrics.get("capacity_censored") == -1 and top and top > factor:
        # censored above: ``factor`` is the margin line's estimate between the workload's load,
        # which held, and the incumbent's, where it lost (``top``); a closed loop's margin is
        # flat until it saturates, so the estimate reads low. The start is the middle of the two
        # in log terms: in the quick start (2026-12-04) two latency picks estimated at 3.76x and
        # 4.28x the workload's load, lost at 7.76x and 8.33x, measured 5.4-5.5x on fresh
        # servers, 7-8 replays each walking up from the estimate
        factor = (float(factor) * float(top)) ** 0.5
    return Start(float(factor) / cfg.confirm.load_factor, rps, near=True)


def median_crossing(metrics: Iterable[Mapping[str, float]]) -> Start | None:
    """The median of these servers' capacities (``metrics``, each a server's; of two, the lower)
    among those bracketed, as a ``near`` start at its crossing with its requests/s, or None:
    where a config's next server starts (a confirm pick's, :func:`capacity_start`; a screen
    config's, :func:`tuner.storage.search_start`)."""
    measured = sorted((m for m in metrics if _bracketed(m)), key=lambda m: m["capacity_factor"])
    if not measured:
        return None
    m = measured[(len(measured) - 1) // 2]
    return Start(float(m["capacity_factor"]), m.get("capacity_rps"), near=True)


def _bracketed(metrics: Mapping[str, float]) -> bool:
    """A capacity between a load that held and one that failed (not censored either way)."""
    factor = metrics.get("capacity_factor")
    return factor is not None and factor > 0 and metrics.get("capacity_censored", 0.0) == 0.0


def stressed(w: WorkloadConfig, cc: ConfirmConfig, seed: int) -> WorkloadConfig:
    """The workload, ``load_factor`` × harder and ``duration_factor`` × longer, in another order."""
    lf, df = cc.load_factor, cc.duration_factor
    a = w.arrival
    arrival = replace(
        a,
        concurrency=max(1, math.ceil(a.concurrency * lf)),
        rate=a.rate * lf,
        ramp_start_rate=None if a.ramp_start_rate is None else a.ramp_start_rate * lf,
        ramp_end_rate=None if a.ramp_end_rate is None else a.ramp_end_rate * lf,
        max_concurrency=None if a.max_concurrency is None else math.ceil(a.max_concurrency * lf),
    )
    trace = None if w.trace is None else replace(w.trace, time_scale=w.trace.time_scale / lf)
    return replace(
        w,
        num_requests=max(1, math.ceil(w.num_requests * df)),
        duration_s=w.duration_s * df,
        seed=seed,
        arrival=arrival,
        trace=trace,
    )


def _describe(name: str, value: float, metrics: Mapping[str, float], q: int) -> str:
    if name.startswith("failed_"):
        return name.removeprefix("failed_")
    if name == "error_rate":
        return f"error rate {metrics.get('error_rate', 1.0):.1%} over the budget"
    m = name.removeprefix("slo_")
    have = metrics.get(f"{m}_p{q}_ms")
    shown = f"{have:,.0f} ms" if have is not None else "no sample"
    return f"{m.upper()} p{q} {shown}, {value:+.0%} over the SLO"


def _higher(metric: str, objective: ObjectiveConfig) -> bool:
    for o in objective.objectives:
        if o.metric == metric:
            return o.direction == "maximize"
    return metric in _HIGHER


def _reported(objective: ObjectiveConfig) -> tuple[str, ...]:
    """The metrics kept for each confirm run: the key metrics, then the objectives (e.g. one the
    key metrics leave out)."""
    extra = [o.metric for o in objective.objectives if o.metric not in KEY_METRICS]
    return (*KEY_METRICS, *dict.fromkeys(extra))


def judge(
    candidate: Candidate,
    runs: Sequence[tuple[int, int, TrialResult]],
    objective: ObjectiveConfig,
) -> ConfirmResult:
    """Worst case over the stress runs ``(round, seed, result)`` of every round; demoted if any
    run failed or broke a constraint (each SLO at ``objective.slo_percentile``, the error budget,
    a failure class)."""
    problems: list[str] = []
    rows: list[dict[str, Any]] = []
    metrics = _reported(objective)
    several = len({rnd for rnd, _, _ in runs}) > 1
    for rnd, seed, r in runs:
        bad = {k: v for k, v in r.constraints.items() if v > 0}
        row: dict[str, Any] = {
            "round": rnd,
            "seed": seed,
            "ok": r.ok and not bad,
            "failure_reason": r.failure_reason,
            "violated": sorted(bad),
            "machine": r.machine,
            **{m: r.metrics[m] for m in metrics if m in r.metrics},
        }
        rows.append(row)
        where = f"round {rnd}, seed {seed}" if several else f"seed {seed}"
        if r.failure_reason:
            problems.append(f"{where}: {r.failure_reason} ({r.failure_detail or ''})".strip())
        elif bad:
            what = "; ".join(
                _describe(k, v, r.metrics, objective.slo_percentile) for k, v in sorted(bad.items())
            )
            problems.append(f"{where}: {what}")
    worst: dict[str, float] = {}
    for m in metrics:
        values = [float(r.metrics[m]) for _, _, r in runs if r.ok and m in r.metrics]
        if values:
            worst[m] = min(values) if _higher(m, objective) else max(values)
    return ConfirmResult(
        trial=candidate.trial,
        picks=candidate.picks,
        params=candidate.params,
        passed=bool(runs) and not problems,
        reason="; ".join(problems) or (None if runs else "no stress run"),
        worst=worst,
        search=candidate.search_metrics,
        runs=tuple(rows),
    )


def round_values(result: ConfirmResult, metric: str, higher: bool) -> tuple[float | None, ...]:
    """``metric`` per round, in round order: the worst over that round's runs, None for a round
    where a run failed or did not report it."""
    by_round: dict[int, list[dict[str, Any]]] = {}
    for row in result.runs:
        by_round.setdefault(int(row.get("round", 1)), []).append(row)
    out: list[float | None] = []
    for rnd in sorted(by_round):
        rows = by_round[rnd]
        values = [row.get(metric) for row in rows if not row.get("failure_reason")]
        if len(values) < len(rows) or any(v is None for v in values):
            out.append(None)
        else:
            out.append(min(values) if higher else max(values))  # type: ignore[type-var]
    return tuple(out)


def round_machines(result: ConfirmResult) -> tuple[str | None, ...]:
    """The machine of each round's server (its runs' first), in round order as
    :func:`round_values`; None where not recorded."""
    first: dict[int, str | None] = {}
    for row in result.runs:
        first.setdefault(int(row.get("round", 1)), row.get("machine"))
    return tuple(first[rnd] for rnd in sorted(first))


def verdict(
    results: Sequence[ConfirmResult],
    candidates: Sequence[Candidate],
    objective: ObjectiveConfig,
    min_effect: float,
    rounds: int,
) -> Verdict:
    """The confirm stage's verdict on the study's first objective (:func:`tuner.verdict.decide`):
    a gain over vLLM's defaults (pick ``baseline``) only where it beats the spread between
    rounds."""
    first = objective.objectives[0]
    higher = first.direction == "maximize"
    by_trial = {r.trial: r for r in results}
    arms = [
        Arm(
            c.trial,
            round_values(by_trial[c.trial], first.metric, higher),
            by_trial[c.trial].passed,
            baseline="baseline" in c.picks,
            machines=round_machines(by_trial[c.trial]),
        )
        for c in candidates
        if c.trial in by_trial
    ]
    return replace(decide(arms, first.metric, higher, min_effect, rounds), quality=note(results))


def recommended(
    results: Sequence[ConfirmResult],
    candidates: Sequence[Candidate],
    picks: Sequence[str],
    decided: Verdict | None = None,
) -> Candidate | None:
    """The verdict's recommended trial (the best pick whose gain over the defaults is claimed,
    else the defaults; :mod:`tuner.verdict`). Without a verdict, the first pick (in
    ``confirm.picks`` order) that held; without confirm runs, the first pick's candidate."""
    if decided is not None and results:
        return next((c for c in candidates if c.trial == decided.recommended), None)
    passed = {r.trial for r in results if r.passed}
    for name in picks:
        for c in candidates:
            if name in c.picks and (not results or c.trial in passed):
                return c
    return None


def conclude(
    study: optuna.Study,
    candidates: Sequence[Candidate],
    results: Sequence[ConfirmResult],
    cfg: TunerConfig,
) -> ConfirmRecord:
    """The confirm stage's record: the candidates, their results and the verdict, decided here on
    ``cfg.objective`` and ``confirm.min_effect`` (the caller stores it:
    :meth:`~tuner.stored_study.ConfirmRecord.store`)."""
    cc = cfg.confirm
    decided = verdict(results, candidates, cfg.objective, cc.min_effect, cc.rounds)
    return ConfirmRecord.of(cc, len(study.trials), candidates, results, decided)


@dataclass(frozen=True)
class Standing:
    """The confirm stage's conclusion as the study stands now (:func:`current_verdict`)."""

    candidates: tuple[Candidate, ...]
    results: tuple[ConfirmResult, ...]
    verdict: Verdict | None
    record: ConfirmRecord | None
    """The stored record it comes from, if the confirm stage stored one."""


def current_verdict(study: optuna.Study, cfg: TunerConfig) -> Standing:
    """The stored record's candidates, results and verdict; when trials came after the confirm
    stage (a later run with ``confirm.enabled=false``), the picks again, the stored results of the
    trials picked again and the verdict decided again on them (with the record's minimum effect
    and rounds). Without a record: the picks, no results, no verdict."""
    record = ConfirmRecord.from_study(study)
    if record is None:
        return Standing(tuple(pick(study, cfg.objective, cfg.confirm.picks)), (), None, None)
    candidates, results, decided = record.candidates, record.results, record.verdict
    n_now = len(study.trials)
    if n_now > (record.n_trials if record.n_trials is not None else n_now):
        candidates = tuple(pick(study, cfg.objective, cfg.confirm.picks))
        held = {r.trial: r for r in results}
        results = tuple(held[c.trial] for c in candidates if c.trial in held)
        decided = None
    if decided is None and results:
        min_effect = record.min_effect if record.min_effect is not None else cfg.confirm.min_effect
        decided = verdict(results, candidates, cfg.objective, min_effect, record.rounds)
    return Standing(candidates, results, decided, record)
