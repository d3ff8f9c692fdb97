"""The confirm stage's choices and verdicts: which trials are picked, how the workload is made
harder, and when a candidate is demoted."""

from __future__ import annotations

from typing import Any

import optuna
import pytest

from tuner.config import (
    ArrivalConfig,
    ConfirmConfig,
    ObjectiveConfig,
    ObjectiveSpec,
    TraceConfig,
    WorkloadConfig,
)
from tuner.confirm import Candidate, judge, pick, recommended, stressed, versus_baseline
from tuner.records import TrialResult

OBJ = ObjectiveConfig(
    objectives=[
        ObjectiveSpec("output_throughput", "maximize"),
        ObjectiveSpec("ttft_p95_ms", "minimize"),
    ]
)


def _add(
    study: optuna.Study,
    tok_s: float,
    ttft: float,
    goodput: float,
    *,
    feasible: bool = True,
    failure: str | None = None,
    baseline: bool = False,
) -> int:
    t = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    t.set_constraint("slo_ttft", -0.5 if feasible else 0.3)
    t.set_user_attr("failure_reason", failure)
    t.set_user_attr("baseline", baseline)
    t.set_user_attr("serve_args", ["/m", "--block-size", "16"])
    t.set_user_attr(
        "metrics", {"output_throughput": tok_s, "ttft_p95_ms": ttft, "goodput": goodput}
    )
    study.tell(t, [tok_s, ttft] if failure is None else [0.0, 1e7])
    return t.number


def _study() -> tuple[optuna.Study, dict[str, int]]:
    study = optuna.create_study(directions=["maximize", "minimize"])
    n = {
        "base": _add(study, 8000, 900, 10, baseline=True),
        "fast": _add(study, 9000, 800, 12),  # high throughput, mid latency
        "low": _add(study, 6000, 200, 9),  # lowest latency
        "knee": _add(study, 8800, 300, 11),
        "infeasible": _add(study, 20000, 100, 50, feasible=False),
        "failed": _add(study, 0, 0, 0, failure="kv_too_small", feasible=False),
    }
    return study, n


def test_pick_chooses_among_feasible_trials_only() -> None:
    study, n = _study()
    cands = {
        p: c.trial
        for c in pick(study, OBJ, ["goodput", "throughput", "latency", "knee"])
        for p in c.picks
    }
    assert cands["goodput"] == n["fast"]  # 12 req/s; the infeasible 50 req/s does not count
    assert cands["throughput"] == n["fast"]
    assert cands["latency"] == n["low"]
    # scaled to [0, 1] on the front {fast, low, knee}: knee is (0.067, 0.167) from the ideal
    assert cands["knee"] == n["knee"]


def test_one_trial_picked_twice_runs_once() -> None:
    study, n = _study()
    cands = pick(study, OBJ, ["goodput", "throughput"])
    assert len(cands) == 1 and cands[0].picks == ("goodput", "throughput")
    assert cands[0].serve_args == ("/m", "--block-size", "16")
    assert cands[0].search_metrics["goodput"] == 12


def test_baseline_pick_is_the_defaults_trial_even_when_infeasible() -> None:
    study, n = _study()
    cands = pick(study, OBJ, ["goodput", "baseline"])
    assert [(c.trial, c.picks) for c in cands] == [
        (n["fast"], ("goodput",)),
        (n["base"], ("baseline",)),
    ]
    assert cands[1].baseline
    # an infeasible (SLO-missing) baseline is still re-measured: it is the reference
    s2 = optuna.create_study(directions=["maximize", "minimize"])
    base = _add(s2, 5000, 3000, 2, feasible=False, baseline=True)
    good = _add(s2, 6000, 500, 8)
    assert {c.trial: c.picks for c in pick(s2, OBJ, ["goodput", "baseline"])} == {
        good: ("goodput",),
        base: ("baseline",),
    }
    # a baseline that failed to start has nothing to re-measure
    s3 = optuna.create_study(directions=["maximize", "minimize"])
    _add(s3, 0, 0, 0, failure="kv_too_small", feasible=False, baseline=True)
    good = _add(s3, 6000, 500, 8)
    assert [c.trial for c in pick(s3, OBJ, ["goodput", "baseline"])] == [good]


def test_no_feasible_trial_no_candidate() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    _add(study, 1, 1, 1, feasible=False)
    assert pick(study, OBJ, ["goodput", "knee"]) == []


def test_single_objective_knee_is_the_best_trial() -> None:
    study = optuna.create_study(direction="maximize")
    for v in (3.0, 7.0, 5.0):
        t = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        t.set_constraint("error_rate", -0.05)
        t.set_user_attr("metrics", {"goodput": v})
        study.tell(t, v)
    obj = ObjectiveConfig(objectives=[ObjectiveSpec("goodput", "maximize")])
    (c,) = pick(study, obj, ["knee"])
    assert c.trial == 1


def test_stressed_workload_is_harder_longer_and_reordered() -> None:
    w = WorkloadConfig(
        name="w",
        num_requests=100,
        duration_s=60,
        seed=0,
        arrival=ArrivalConfig(kind="poisson", concurrency=5, rate=3.0, max_concurrency=7),
    )
    s = stressed(w, ConfirmConfig(load_factor=2.0, duration_factor=3.0), seed=4)
    assert (s.num_requests, s.duration_s, s.seed) == (300, 180, 4)
    assert (s.arrival.concurrency, s.arrival.rate, s.arrival.max_concurrency) == (10, 6.0, 14)
    assert w.num_requests == 100  # the search's workload is untouched
    t = stressed(
        WorkloadConfig(name="t", trace=TraceConfig(path="x.csv", time_scale=1.0)),
        ConfirmConfig(load_factor=4.0),
        seed=1,
    )
    assert t.trace is not None and t.trace.time_scale == pytest.approx(0.25)


def _result(metrics: dict[str, float], constraints: dict[str, float], failure: str | None = None):
    return TrialResult(
        number=3,
        params={},
        argv=(),
        values=None,
        constraints=constraints,
        metrics=metrics,
        failure_reason=failure,
        failure_detail="boom" if failure else None,
    )


CAND = Candidate(3, ("goodput",), {}, False, (), {"goodput": 12.0})


def test_judge_keeps_the_worst_run_and_passes_a_good_candidate() -> None:
    runs: list[tuple[int, Any]] = [
        (1, _result({"goodput": 11.0, "ttft_p95_ms": 700.0}, {"slo_ttft": -0.6})),
        (2, _result({"goodput": 9.0, "ttft_p95_ms": 900.0}, {"slo_ttft": -0.5})),
    ]
    v = judge(CAND, runs, OBJ)
    assert v.passed and v.reason is None
    assert v.worst == {"goodput": 9.0, "ttft_p95_ms": 900.0}
    assert [r["seed"] for r in v.runs] == [1, 2]


def test_judge_demotes_on_a_missed_slo_or_a_failure_with_the_reason() -> None:
    slo = judge(
        CAND,
        [
            (1, _result({"goodput": 11.0, "ttft_p95_ms": 700.0}, {"slo_ttft": -0.6})),
            (2, _result({"goodput": 5.0, "ttft_p95_ms": 2600.0}, {"slo_ttft": 0.3})),
        ],
        OBJ,
    )
    assert not slo.passed
    assert slo.reason is not None and "seed 2" in slo.reason and "TTFT p95 2,600 ms" in slo.reason
    dead = judge(CAND, [(1, _result({}, {"failed_engine_dead": 1.0}, "engine_dead"))], OBJ)
    assert not dead.passed and dead.reason is not None and "engine_dead" in dead.reason
    assert not judge(CAND, [], OBJ).passed


def test_recommended_is_the_first_pick_that_held() -> None:
    a = Candidate(1, ("goodput",), {}, False, (), {})
    b = Candidate(2, ("latency", "knee"), {}, False, (), {})
    ok = judge(b, [(1, _result({"goodput": 1.0}, {"slo_ttft": -0.1}))], OBJ)
    bad = judge(a, [(1, _result({}, {"slo_ttft": 0.2}))], OBJ)
    bad = type(bad)(**{**bad.__dict__, "trial": 1})
    ok = type(ok)(**{**ok.__dict__, "trial": 2})
    assert recommended([bad, ok], [a, b], ["goodput", "latency", "knee"]) == b
    assert recommended([], [a, b], ["goodput", "latency"]) == a  # unconfirmed: first pick
    assert recommended([bad], [a], ["goodput"]) is None


def test_defaults_recommended_when_the_confirm_runs_do_not_reproduce_the_gain() -> None:
    pick_ = Candidate(6, ("goodput",), {}, False, (), {})
    base = Candidate(0, ("baseline",), {}, True, (), {})

    def res(c: Candidate, goodput: float, ok: bool = True) -> Any:
        r = judge(c, [(1, _result({"goodput": goodput}, {"slo_ttft": -0.1 if ok else 0.2}))], OBJ)
        return type(r)(**{**r.__dict__, "trial": c.trial})

    picks = ["goodput", "baseline"]
    # the pick measured 101 req/s and the defaults 110 in the same confirm runs: the defaults
    lost = [res(pick_, 101.4), res(base, 109.6)]
    assert recommended(lost, [pick_, base], picks, OBJ) == base
    assert versus_baseline(pick_, "goodput", lost, [pick_, base], OBJ) == (
        "goodput",
        101.4,
        109.6,
        False,
    )
    # the gain held: the pick
    won = [res(pick_, 120.0), res(base, 109.6)]
    assert recommended(won, [pick_, base], picks, OBJ) == pick_
    # defaults that missed the SLO in the confirm runs are no reference
    base_bad = [res(pick_, 101.4), res(base, 109.6, ok=False)]
    assert recommended(base_bad, [pick_, base], picks, OBJ) == pick_
    # without the objective (old callers) or without a baseline pick: the first pick that held
    assert recommended(lost, [pick_, base], picks) == pick_
    assert recommended(lost[:1], [pick_], ["goodput"], OBJ) == pick_
