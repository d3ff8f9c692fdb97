"""The incumbent probe of the capacity search (tuner.capacity ``start``/``stop_on_loss``), the
study's incumbent (tuner.stored_study.incumbent_capacity), a capacity censored above as the tables
show it, and the confirm stage's ``capacity`` pick: no server, no subprocess."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from helpers.capacity import probe_of

from tuner import stored_trial
from tuner.capacity import MAX_JUMP, Start, Step, narrow_climb, search, shown
from tuner.config import CapacityConfig, ConfirmConfig, TunerConfig
from tuner.confirm import capacity_start, pick
from tuner.console import fmt_metric
from tuner.records import TrialResult
from tuner.stored_study import incumbent_capacity, pareto_rows
from tuner.tracking import open_tracker

SETTINGS = CapacityConfig(rel_width=0.05, max_steps=8)


def first_at_one(margin_at: Callable[[float], float]) -> Step:
    """The workload's own replay (factor 1), as the trial measured it before the search."""
    m = margin_at(1.0)
    return Step(1.0, 10.0, m, m >= 0)


# --- the search -------------------------------------------------------------------------------


async def test_a_loss_at_the_incumbents_load_ends_the_search_after_that_one_step() -> None:
    # this config holds up to factor 1.94 (19.4 req/s); the incumbent holds up to 6.97
    def margin(f: float) -> float:
        return 1 - f / 1.94

    probe, tried = probe_of(margin)
    cap = await search(probe, SETTINGS, first_at_one(margin), start=Start(6.97), stop_on_loss=True)
    assert tried == [6.97]  # one replay, at the incumbent's load
    assert cap.capped and not cap.censored
    assert cap.metrics()["capacity_censored"] == -1.0
    assert cap.metrics()["capacity_steps"] == 2.0  # the workload's own and the probe
    assert cap.high == pytest.approx(69.7)  # below the load that failed
    assert 10.0 <= cap.rps < cap.high  # the estimate on the margin line, under the bound
    # the line through (1, 0.48) and (6.97, -2.59) crosses zero at 1.94: the real capacity
    assert cap.rps == pytest.approx(19.4, rel=0.01)


async def test_a_loss_at_the_incumbents_load_is_never_above_the_incumbent() -> None:
    # a closed loop past its SLOs can serve more requests/s than the incumbent did at its
    # crossing (here 4x the rate per load, and no step held): the trial lost where the incumbent
    # held, so its capacity is capped at the incumbent's requests/s, bound and estimate alike
    def margin(f: float) -> float:
        return 1 - f / 0.5

    probe, tried = probe_of(margin, rps_per_factor=40.0)
    first = Step(1.0, 40.0, margin(1.0), False)
    cap = await search(probe, SETTINGS, first, start=Start(3.0, 30.0), stop_on_loss=True)
    assert tried == [] and cap.capped
    assert cap.high == 30.0 and cap.rps <= 30.0
    probe, tried = probe_of(lambda f: 1 - f / 2.0, rps_per_factor=40.0)
    first = Step(1.0, 10.0, 0.5, True)  # held at its own load, 10 req/s
    cap = await search(probe, SETTINGS, first, start=Start(3.0, 30.0), stop_on_loss=True)
    assert tried == [3.0] and cap.capped and cap.high == 30.0 and 10.0 <= cap.rps <= 30.0
    # never below a rate that held within the SLOs
    cap = await search(probe, SETTINGS, first, start=Start(3.0, 5.0), stop_on_loss=True)
    assert cap.high == 10.0 and cap.rps == 10.0
    # without the incumbent's rate: the failed step's own rate bounds it, as before
    cap = await search(probe, SETTINGS, first, start=Start(3.0), stop_on_loss=True)
    assert cap.high == 120.0


async def test_a_closed_loop_that_lost_yet_served_more_is_measured_not_capped() -> None:
    # a quick start's fp8 trial (2026-12-05) lost at the incumbent's 489 in flight by a hair,
    # serving ~86 req/s there against the incumbent's 70.3, was capped "< 70.3 (~70.0)" and
    # measured 84-90 req/s on 3 fresh servers. Here: its requests finish sooner (40 req/s per
    # unit of load against the incumbent's 10), its SLOs hold up to 2.9: capacity 116 req/s
    def margin(f: float) -> float:
        return 1 - f / 2.9

    probe, tried = probe_of(margin, rps_per_factor=40.0)
    first = Step(1.0, 40.0, margin(1.0), True)
    cap = await search(
        probe, SETTINGS, first, start=Start(3.0, 30.0), stop_on_loss=True, closed=True
    )
    assert tried[0] == 3.0 and len(tried) > 1  # lost there, served 120 > 30: measured below
    assert tried[1] == pytest.approx(3.0 / 1.045)  # a narrow step down, the crossing is near
    assert not cap.capped and cap.rps == pytest.approx(116.0, rel=0.03)
    # served no more than the incumbent's capacity there: it cannot beat it below, so it stops
    probe, tried = probe_of(lambda f: 1 - f / 2.9, rps_per_factor=9.0)
    cap = await search(
        probe, SETTINGS, Step(1.0, 9.0, 0.6, True), start=Start(3.0, 30.0), stop_on_loss=True,
        closed=True,
    )  # fmt: skip
    assert tried == [3.0] and cap.capped and cap.high <= 30.0

    # a pruned step's rate (the short requests that finished before the prune) decides nothing
    async def pruned(f: float) -> Step:
        return Step(f, 120.0, -0.5, False, pruned="26 of 489 requests over the TTFT SLO")

    cap = await search(
        pruned, SETTINGS, Step(1.0, 40.0, 0.6, True), start=Start(3.0, 30.0), stop_on_loss=True,
        closed=True,
    )  # fmt: skip
    assert cap.capped and len(cap.steps) == 2
    # an open loop's load is a rate: a loss at the incumbent's rate ends it whatever it served
    probe, tried = probe_of(margin, rps_per_factor=40.0)
    cap = await search(probe, SETTINGS, first, start=Start(3.0, 30.0), stop_on_loss=True)
    assert tried == [3.0] and cap.capped


async def test_a_closed_loop_walking_down_stops_at_a_loss_that_served_no_more() -> None:
    # a quick start's trial (2026-12-05, max_num_seqs 198) lost at the incumbent's 520 in flight
    # (8.12x) serving 72.01 req/s, more than the incumbent's 71.58: its requests queue behind
    # the cap, so its rate saturates while its TTFT grows. It walked down 6 more replays to
    # 63.8 req/s, a loser. Here its rate saturates at 72 req/s from 7.2x and its SLOs hold up to
    # 6.38x: the first two steps down (7.77x and 7.44x, 72 req/s) lost serving more, the next
    # (6.81x, 68.1) lost serving no more than the incumbent, so its capacity lies below: capped
    edge = 6.38  # the SLOs hold up to this load factor
    tried: list[float] = []

    async def saturating(f: float) -> Step:
        tried.append(f)
        m = 1 - f / edge
        return Step(f, min(10.0 * f, 72.0), m, m >= 0)

    first = Step(1.0, 10.0, 1 - 1 / edge, True)
    start = Start(8.12, 71.58)
    cap = await search(saturating, SETTINGS, first, start=start, stop_on_loss=True, closed=True)
    down = narrow_climb(SETTINGS.rel_width)  # ×1.045 twice, then its square
    assert tried == pytest.approx([8.12, 8.12 / down, 8.12 / down**2, 8.12 / down**4])
    assert cap.capped and cap.high <= 71.58 and cap.rps < 71.58
    # the same config without an incumbent to lose to is measured: 63.8 req/s
    tried.clear()
    cap = await search(saturating, SETTINGS, first, start=start, closed=True)
    assert not cap.capped and cap.rps == pytest.approx(63.8, rel=0.03) and len(tried) > 3
    # one whose SLOs hold near saturation (up to 7.5x) beats the incumbent below its load:
    # 7.77x lost serving more, 7.44x held (72 req/s), and the search brackets it, not capped
    edge = 7.5
    tried.clear()
    cap = await search(saturating, SETTINGS, first, start=start, stop_on_loss=True, closed=True)
    assert tried[:3] == pytest.approx([8.12, 8.12 / down, 8.12 / down**2])
    assert not cap.capped and 71.58 < cap.rps <= 72.0


async def test_without_stop_on_loss_a_failed_start_is_bracketed() -> None:
    def margin(f: float) -> float:
        return 1 - f / 1.94

    probe, tried = probe_of(margin)
    cap = await search(probe, SETTINGS, first_at_one(margin), start=Start(6.97))
    assert tried[0] == 6.97 and len(tried) > 1  # narrowed between 1 and 6.97
    assert not cap.capped and cap.rps == pytest.approx(19.4, rel=0.01)


async def test_a_loss_at_the_workloads_own_load_below_the_incumbent_needs_no_step() -> None:
    def margin(f: float) -> float:
        return 1 - f / 0.5  # fails at factor 1 already (margin -1: twice the SLO)

    probe, tried = probe_of(margin)
    cap = await search(probe, SETTINGS, first_at_one(margin), start=Start(3.0), stop_on_loss=True)
    assert tried == []
    assert cap.capped and cap.high == 10.0
    assert cap.rps == pytest.approx(5.0)  # the failed load over its overshoot (1 - margin)


async def test_a_hold_at_the_incumbent_climbs_from_there() -> None:
    def margin(f: float) -> float:
        return 1 - f / 9.0

    probe, tried = probe_of(margin)
    cap = await search(probe, SETTINGS, first_at_one(margin), start=Start(5.0), stop_on_loss=True)
    assert tried[0] == 5.0
    assert tried[1] == pytest.approx(5.0 / (5.0 / 9.0))  # margin 0.44 at 5: x1.8, to 9's edge
    assert not cap.capped and cap.rps == pytest.approx(90.0, rel=0.02)


async def test_a_closed_loop_that_holds_at_the_incumbent_climbs_by_narrow_steps() -> None:
    # quick starts of 2026-12-05: a trial held at the incumbent's 7.20x with a margin of 0.13 (its
    # TTFT well under the SLO: a closed loop's margin is flat until it saturates), jumped by it
    # to 8.32x, failed, and narrowed through 7.77x and 7.50x: 5 replays for a crossing 4 % up.
    # By narrow steps: 7.20x held, 7.52x failed, closed: 3
    def margin(f: float) -> float:
        return 0.134 if f <= 7.45 else -0.2

    probe, tried = probe_of(margin)
    first = Step(1.0, 10.0, 0.8, True)
    cap = await search(
        probe, SETTINGS, first, start=Start(7.20, 70.6), stop_on_loss=True, closed=True
    )
    assert tried == pytest.approx([7.20, 7.20 * narrow_climb(SETTINGS.rel_width)])
    assert not cap.capped and 7.20 <= cap.low / 10.0 <= 7.45 <= cap.high / 10.0
    # an open loop's margin still says how far: the same hold jumps by it (x1.15)
    probe, tried = probe_of(margin)
    await search(probe, SETTINGS, first, start=Start(7.20, 70.6), stop_on_loss=True)
    assert tried[1] == pytest.approx(7.20 / (1 - 0.134))


async def test_a_closed_loop_that_holds_serving_clearly_more_climbs_by_its_margin() -> None:
    # a quick start's fp8 trial of 2026-12-06 (qs1, trial 16) held at the incumbent's 8.27x
    # serving 86.4 req/s against the incumbent's 70.0 (+23 %), then walked by narrow steps through
    # 8.64x, 9.03x and 9.88x to a crossing near 10.5x: 8 replays. No near-tie: it climbs by its
    # margin, as an open loop does, and a near-tie still walks by narrow steps
    def margin(f: float) -> float:
        return 0.137 if f <= 10.5 else -0.2

    first = Step(1.0, 10.0, 0.8, True)
    probe, tried = probe_of(margin)  # serves 10 req/s per factor: 82.7 at 8.27x
    cap = await search(
        probe, SETTINGS, first, start=Start(8.27, 66.0), stop_on_loss=True, closed=True
    )
    assert tried[1] == pytest.approx(8.27 / (1 - 0.137))  # 82.7 > 66.0 x 1.05: its margin
    assert not cap.capped and 8.27 <= cap.low / 10.0 <= 10.5 <= cap.high / 10.0
    probe, tried = probe_of(margin)
    await search(probe, SETTINGS, first, start=Start(8.27, 80.0), stop_on_loss=True, closed=True)
    assert tried[1] == pytest.approx(8.27 * narrow_climb(SETTINGS.rel_width))  # 82.7: within 5 %


async def test_a_wide_margin_jumps_further_than_doubling() -> None:
    def margin(f: float) -> float:
        return 1 - f / 40.0  # at the incumbent's load 2: margin 0.95

    probe, tried = probe_of(margin)
    cap = await search(probe, SETTINGS, first_at_one(margin), start=Start(2.0), stop_on_loss=True)
    assert tried[:3] == [2.0, 2.0 * MAX_JUMP, 2.0 * MAX_JUMP**2]  # bounded at MAX_JUMP a step
    assert cap.rps == pytest.approx(400.0, rel=0.02)
    # a margin of 0.6 extrapolates to 1 / 0.4 = x2.5: between the bounds
    probe, tried = probe_of(lambda f: 1 - f / 2.0 if f > 2 else 0.6)
    await search(probe, SETTINGS, Step(1.0, 10.0, 0.6, True), start=Start(2.0), stop_on_loss=True)
    assert tried[1] == pytest.approx(5.0)


async def test_without_a_start_the_search_doubles_as_before() -> None:
    def margin(f: float) -> float:
        return 1 - f / 40.0

    probe, tried = probe_of(margin)
    await search(probe, SETTINGS, first_at_one(margin))
    assert tried[:3] == [2.0, 4.0, 8.0]  # no jump without an incumbent


# --- the study ----------------------------------------------------------------------------------


def _capacity_trial(
    study: optuna.Study,
    rps: float,
    factor: float,
    censored: float = 0.0,
    ok: bool = True,
    baseline: bool = False,
) -> None:
    t = study.ask()
    if baseline:
        t.set_user_attr("baseline", True)
    t.set_user_attr("metrics", {"capacity_rps": rps, "capacity_factor": factor,
                                "capacity_censored": censored, "ttft_p95_ms": 50.0})  # fmt: skip
    system, user = stored_trial.constraint_attrs({"error_rate": -0.05 if ok else 0.5})
    for k, v in system.items():
        t.storage.set_trial_system_attr(t._trial_id, k, v)
    for k, v in user.items():
        t.set_user_attr(k, v)
    study.tell(t, [rps, 50.0])


def _study() -> optuna.Study:
    return optuna.create_study(directions=["maximize", "minimize"])


def test_the_incumbent_is_the_best_feasible_measured_capacity() -> None:
    study = _study()
    assert incumbent_capacity(study) is None  # the first trial: as today
    _capacity_trial(study, 30.0, 3.0)
    _capacity_trial(study, 90.0, 9.0, ok=False)  # infeasible: errors over the budget
    _capacity_trial(study, 50.0, 5.0, censored=-1.0)  # an estimate under a loss, not a measure
    _capacity_trial(study, 20.0, 2.0)
    assert incumbent_capacity(study) == Start(3.0, 30.0)
    _capacity_trial(study, 40.0, 4.0, censored=1.0)  # held everywhere tried: at least 40
    assert incumbent_capacity(study) == Start(4.0, 40.0)


def test_a_capacity_censored_above_is_shown_as_less_than(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    assert shown(19.4, -1.0) == "< 19.4" and shown(69.7, 1.0) == ">= 69.7"
    # the bound established (the load that failed) first, then the estimate under it
    assert shown(19.4, -1.0, 58.2) == "< 58.2 (~19.4)"
    capped = {"capacity_censored": -1.0, "capacity_rps_high": 58.2}
    assert fmt_metric("capacity_rps", 19.4, capped) == "< 58.2 (~19.4) req/s"
    assert fmt_metric("capacity_rps", 69.7, {"capacity_censored": 0.0}) == "69.7 req/s"
    study = _study()
    _capacity_trial(study, 19.4, 1.94, censored=-1.0)
    cfg = make_cfg("+workload=chat", "objective=capacity", "workload.slo.ttft_ms=500")
    (row,) = pareto_rows(study, cfg)
    assert row["capacity_censored"] == -1.0 and row["capacity_rps"] == 19.4


def test_figures_show_a_capacity_censored_above_as_less_than() -> None:
    from tuner.plots import pareto_figure, trial_points

    study = _study()
    study.set_metric_names(["capacity_rps", "ttft_p95_ms"])
    _capacity_trial(study, 30.0, 3.0)
    _capacity_trial(study, 19.4, 1.94, censored=-1.0)
    points = trial_points(study)
    assert not isinstance(points["capacity_shown"].tolist()[0], str)  # bracketed: none
    assert points["capacity_shown"].tolist()[1] == "< 19.4"  # no bound stored: the estimate
    fig = pareto_figure(points, [("capacity_rps", "maximize"), ("ttft_p95_ms", "minimize")])
    below = [t for t in fig.data if t.legendgroup == "censored"]
    assert len(below) == 1 and list(below[0].customdata) == [1]
    assert "capacity_rps: < 19.4 (censored)" in below[0].hovertext[0]
    assert not any("< " in h for t in fig.data if t.legendgroup == "pareto" for h in t.hovertext)


# --- confirm ------------------------------------------------------------------------------------


def test_confirm_picks_by_the_capacity_objective_under_it(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    # the best capacity in place of goodput at the workload's own load (issue 29, item 2)
    cfg = make_cfg("+workload=chat", "objective=capacity", "workload.slo.ttft_ms=500")
    assert cfg.confirm.picks == ["capacity", "latency", "knee", "baseline"]
    assert make_cfg("+workload=chat", "objective=throughput").confirm.picks[0] == "goodput"
    picked = make_cfg("+workload=chat", "objective=capacity", "confirm.picks=[goodput,baseline]")
    assert picked.confirm.picks == ["goodput", "baseline"]  # the user's own picks: kept
    study = _study()
    _capacity_trial(study, 30.0, 3.0)
    _capacity_trial(study, 69.7, 6.97)
    _capacity_trial(study, 99.0, 9.9, censored=-1.0)  # an estimate: never the pick
    (best,) = [c for c in pick(study, cfg.objective, ["capacity"])]
    assert best.trial == 1 and best.picks == ("capacity",)
    # its confirm servers start at its search capacity, on the stressed workload's scale, and
    # walk from there by narrow steps (tests/unit/test_capacity.py: a near start)
    cc = ConfirmConfig(load_factor=2.0)
    start = capacity_start(best, TunerConfig(confirm=cc))
    assert start is not None and start.factor == pytest.approx(6.97 / 2.0)
    assert start.rps == 69.7 and start.near
    # a pick censored above (e.g. the latency pick lost at the incumbent's load): its capacity
    # is the margin line's estimate, which a saturating closed loop puts low; its servers start
    # halfway (in log terms) to the load it lost at
    lost = {**best.search_metrics, "capacity_censored": -1.0, "capacity_factor_high": 13.0}
    start = capacity_start(replace(best, search_metrics=lost), TunerConfig(confirm=cc))
    assert start is not None and start.factor == pytest.approx((6.97 * 13.0) ** 0.5 / 2.0)
    assert start.near


def test_a_picks_later_confirm_servers_start_where_its_first_crossed(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    # issue 29: a censored latency pick started each of its 3 servers at a guess and took 5
    # replays each; once one server bracketed its capacity, the next start there (the median
    # crossing, on the stressed stream's own scale: not divided by confirm.load_factor again)
    cfg = make_cfg("+workload=chat", "objective=capacity")
    study = _study()
    _capacity_trial(study, 69.7, 6.97)
    (best,) = pick(study, cfg.objective, ["capacity"])
    lost = {**best.search_metrics, "capacity_censored": -1.0, "capacity_factor_high": 13.0}
    censored = replace(best, search_metrics=lost)
    guess = capacity_start(censored, cfg)
    assert guess is not None

    def server(factor: float, rps: float, censored: float = 0.0, failed: bool = False):
        m = {"capacity_factor": factor, "capacity_rps": rps, "capacity_censored": censored}
        return TrialResult(0, {}, (), None if failed else (rps, 400.0), {}, m,
                           failure_reason="server_died" if failed else None)  # fmt: skip

    one = capacity_start(censored, cfg, [server(2.26, 63.5)])
    assert one == Start(2.26, 63.5, near=True)
    three = [server(2.31, 64.0), server(2.2, 62.9), server(2.26, 63.5)]
    assert capacity_start(censored, cfg, three) == Start(2.26, 63.5, near=True)
    two = [server(2.31, 64.0), server(2.2, 62.9)]
    assert capacity_start(censored, cfg, two) == Start(2.2, 62.9, near=True)  # the lower
    # a server that failed, or one whose capacity is censored (held everywhere, or no load
    # held), tells no crossing: the start stays the search's
    useless = [server(2.5, 70.0, failed=True), server(3.0, 80.0, censored=1.0), server(0.0, 0.0)]
    assert capacity_start(censored, cfg, useless) == guess
    assert capacity_start(best, cfg, useless) == capacity_start(best, cfg)


def test_mlflow_shows_a_capacity_censored_above_as_less_than(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = open_tracker(True, uri, "e", "run", {}, lambda s: s)
    metrics = {"capacity_rps": 19.4, "capacity_censored": -1.0, "capacity_rps_high": 58.2}
    metrics["error_rate"] = 0.0
    result = TrialResult(0, {}, (), (19.4, 50.0), {}, metrics)
    tracker.log_trial(result, tmp_path / "trial_0000", {})
    tracker.finish("FINISHED")
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("e")
    assert exp is not None
    (child,) = client.search_runs([exp.experiment_id], "tags.`trial.number` = '0'")
    assert child.data.tags["capacity"] == "< 58.2 (~19.4) req/s"
    assert child.data.metrics["capacity_censored"] == -1.0


def test_the_live_best_capacity_is_never_one_censored_above(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    from tuner.console import live_best

    cfg = make_cfg("+workload=chat", "objective=capacity", "workload.slo.ttft_ms=500")
    study = _study()
    _capacity_trial(study, 30.0, 3.0)
    _capacity_trial(study, 99.0, 9.9, censored=-1.0)  # an estimate under a bound (an old study)
    assert "capacity_rps 30.0 req/s (trial 0)" in live_best(study, cfg)


# --- a predicted start: the warm-start study's capacity (issue 29, item 1) ----------------------


async def test_a_loss_at_a_predicted_start_does_not_end_the_search() -> None:
    # a prediction (binding=False) says 6.97; this config holds up to 1.94: the search goes on
    # below it and brackets, where the study's own incumbent would have ended it
    def margin(f: float) -> float:
        return 1 - f / 1.94

    probe, tried = probe_of(margin)
    start = Start(6.97, None, None, binding=False)
    cap = await search(probe, SETTINGS, first_at_one(margin), start=start, stop_on_loss=True)
    assert tried[0] == 6.97 and len(tried) > 1
    assert not cap.capped and cap.bound == 0.0  # bracketed, not censored above
    assert cap.low <= 19.4 <= cap.high


def test_the_first_trial_starts_from_the_warm_start_studys_capacity(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    from tuner.storage import search_start, storage_url

    cfg = make_cfg("+workload=chat", "objective=capacity", "study.warm_start=earlier")
    Path(cfg.paths.state_dir).mkdir(parents=True, exist_ok=True)
    url = storage_url(cfg)
    earlier = optuna.create_study(
        study_name="earlier", storage=url, directions=["maximize", "minimize"]
    )
    _capacity_trial(earlier, 30.0, 3.0)
    _capacity_trial(earlier, 50.0, 5.0)
    now = optuna.create_study(study_name="now", storage=url, directions=["maximize", "minimize"])
    # before this study measured a capacity: the other study's best, as a prediction only
    assert search_start(now, cfg) == Start(5.0, None, None, binding=False)
    _capacity_trial(now, 20.0, 2.0)
    assert search_start(now, cfg) == Start(2.0, 20.0)  # then its own incumbent, binding
    # vLLM's defaults (the baseline trial) start there too, but go on below a loss: the
    # study's reference gets its own capacity
    assert search_start(now, cfg, baseline=True) == Start(2.0, None, None, binding=False)
    off = make_cfg("+workload=chat", "objective=capacity", "study.warm_start=earlier",
                   "objective.capacity.incumbent_probe=false")  # fmt: skip
    assert search_start(now, off) is None
    plain = make_cfg("+workload=chat", "objective=capacity")
    fresh = optuna.create_study(directions=["maximize", "minimize"])
    assert search_start(fresh, plain) is None  # no warm start, nothing measured: as before


def test_a_screen_server_starts_from_the_defaults_capacity_as_a_prediction(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    """The lever screen (incumbent probe off): the first defaults' server searches from the
    workload's load; every later server tries the defaults' best capacity first, not a lever's
    and not binding (a lever that loses there gets its own capacity below it)."""
    from tuner.storage import search_start

    cfg = make_cfg("+workload=chat", "mode=screen")
    study = _study()
    assert search_start(study, cfg) is None  # nothing measured yet
    _capacity_trial(study, 60.0, 1.2, baseline=True)
    _capacity_trial(study, 80.0, 1.6)  # a lever above the defaults: not the prediction
    _capacity_trial(study, 66.0, 1.3, baseline=True)
    assert search_start(study, cfg) == Start(1.3, None, None, binding=False)
    off = make_cfg("+workload=chat", "mode=screen", "screen.predict_start=false")
    assert search_start(study, off) is None


def test_a_screen_server_of_a_config_measured_before_starts_at_its_own_crossing(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    """A screen's later server of one config (the same params) starts near the median crossing
    of its earlier servers, as a prediction; a config not measured yet, from the defaults'
    capacity as before; a censored capacity is no crossing."""
    from tuner.storage import search_start

    cfg = make_cfg("+workload=chat", "mode=screen")
    study = _study()
    kv = {"kv_cache_dtype": optuna.distributions.CategoricalDistribution(["auto", "fp8"])}

    def server(value: str, factor: float, censored: float = 0.0) -> None:
        study.enqueue_trial({"kv_cache_dtype": value})
        t = study.ask(kv)
        if value == "auto":
            t.set_user_attr("baseline", True)
        t.set_user_attr("metrics", {"capacity_rps": 50.0 * factor, "capacity_factor": factor,
                                    "capacity_censored": censored, "ttft_p95_ms": 50.0})  # fmt: skip
        system, user = stored_trial.constraint_attrs({"error_rate": -0.05})
        for k, v in system.items():
            t.storage.set_trial_system_attr(t._trial_id, k, v)
        for k, v in user.items():
            t.set_user_attr(k, v)
        study.tell(t, [50.0 * factor, 50.0])

    fp8, auto = {"kv_cache_dtype": "fp8"}, {"kv_cache_dtype": "auto"}
    server("auto", 1.2)
    defaults = Start(1.2, None, None, binding=False)
    assert search_start(study, cfg, fp8) == defaults  # not measured yet: the defaults' capacity
    assert search_start(study, cfg) == defaults  # without params, as before
    server("fp8", 1.4)
    server("fp8", 1.3)
    # of two servers, the lower crossing
    assert search_start(study, cfg, fp8) == Start(1.3, None, binding=False, near=True)
    server("fp8", 1.5)
    server("fp8", 3.0, censored=1.0)  # held everywhere tried: no crossing
    assert search_start(study, cfg, fp8) == Start(1.4, None, binding=False, near=True)
    assert search_start(study, cfg, auto) == Start(1.2, None, binding=False, near=True)
    off = make_cfg("+workload=chat", "mode=screen", "screen.predict_start=false")
    assert search_start(study, off, fp8) is None
