"""The capacity card on made-up steps: capacity per SLO tier re-judged from the stored
percentiles, the interval over servers, servers/GPUs for a target and the cost per 1M tokens."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from rich.console import Console

from tuner import capacity_card as cc
from tuner import study_card as sc
from tuner.capacity import Step, from_steps
from tuner.config import ObjectiveConfig, SLOConfig, TunerConfig
from tuner.errors import ConfigError
from tuner.plots import card_data, card_figure
from tuner.records import Candidate

OBJ = ObjectiveConfig(slo_percentile=95, max_error_rate=0.05)
SLO = SLOConfig(ttft_ms=1000.0, tpot_ms=50.0)


def step(factor: float, rps: float, ttft: float, tpot: float, pruned: str | None = None) -> Step:
    """A step judged at :data:`SLO` as the search judges it (its margin from its percentiles)."""
    metrics = {"ttft_p95_ms": ttft, "tpot_p95_ms": tpot, "error_rate": 0.0}
    margin = min(1 - ttft / 1000.0, 1 - tpot / 50.0, 1.0)
    return Step(factor, rps, margin, margin >= 0, metrics, pruned)


# TTFT grows with the load; TPOT 20 ms at 1x up to 90 ms at 4x
STEPS = [
    step(1.0, 10.0, 200.0, 20.0),
    step(2.0, 20.0, 400.0, 30.0),
    step(4.0, 40.0, 1600.0, 90.0),
    step(3.0, 30.0, 800.0, 45.0),
]


def test_the_workload_tier_is_the_search_answer() -> None:
    t = cc.tier_capacity(STEPS, OBJ, SLO, 1.0)
    cap = from_steps(STEPS)
    assert (t.rps, t.low, t.high, t.outside) == (cap.rps, cap.low, cap.high, None)
    assert 30.0 < t.rps < 40.0


def test_a_looser_tier_holds_more_and_a_stricter_less() -> None:
    strict = cc.tier_capacity(STEPS, OBJ, SLO, 0.5)  # TTFT 500, TPOT 25: 1x holds, 2x fails
    loose = cc.tier_capacity(STEPS, OBJ, SLO, 2.0)  # TTFT 2000, TPOT 100: 4x holds
    assert strict.outside is None and 10.0 <= strict.rps <= 20.0
    assert strict.low == 10.0 and strict.high == 20.0
    assert loose.outside == "above" and loose.rps == 40.0  # every load held: at least 40


def test_below_every_measured_load_is_outside() -> None:
    t = cc.tier_capacity(STEPS, OBJ, SLO, 0.1)  # TTFT 100 ms: nothing held
    assert t.outside == "below" and t.rps == 0.0 and t.high == 10.0


def test_a_pruned_step_is_never_held_at_a_looser_tier() -> None:
    steps = [step(1.0, 10.0, 200.0, 20.0), step(2.0, 20.0, 1200.0, 60.0, pruned="over the SLO")]
    assert cc.tier_capacity(steps, OBJ, SLO, 1.0).high == 20.0  # failed: the bracket's top
    loose = cc.tier_capacity(steps, OBJ, SLO, 2.0)  # its partial p95 would hold: left out
    assert loose.outside == "above" and loose.rps == 10.0


def test_tiers_never_read_lower_when_looser() -> None:
    # a closed loop serving less at a higher load: the looser crossing lies lower on the line
    steps = [
        step(1.0, 30.0, 400.0, 20.0),
        step(1.5, 32.0, 900.0, 45.0),
        step(2.0, 25.0, 1500.0, 80.0),
        step(3.0, 24.0, 2500.0, 120.0),
    ]
    tiers = cc.tiers_of(steps, OBJ, SLO, [0.5, 1.0, 2.0])
    raw = cc.tier_capacity(steps, OBJ, SLO, 2.0)
    assert raw.rps < tiers[1.0].rps  # what the floor is for: the check can fail
    assert tiers[2.0].rps >= tiers[1.0].rps >= tiers[0.5].rps


def test_the_confirmed_tier_bounds_the_stricter_ones_and_floors_the_looser(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    """The same trial confirmed at 69.0-69.9 req/s on 3 fresh servers: its stricter tier,
    from the search's wide bracket, read 122.9 and raised the workload's tier to it, so the
    card claimed 44 % less cost per request than the defaults at the same measured capacity."""
    cfg = make_cfg("+workload=chat", "workload.slo.ttft_ms=1000", "workload.slo.tpot_ms=50")
    steps = [step(1.0, 40.34, 167.0, 11.6), step(7.609, 95.55, 1040.0, 54.9, pruned="TPOT")]
    rounds = [69.0, 69.4, 69.9]
    e = sc.entry(13, "latency", False, 1, [steps], cfg, rounds)
    mean = math.exp(sum(math.log(v) for v in rounds) / 3)
    assert e.tiers[1.0].rps == pytest.approx(mean) and e.tiers[1.0].n == 3
    assert e.tiers[0.5].rps == e.tiers[1.0].rps and e.tiers[0.5].low == 40.34  # 122.9 capped
    assert e.tiers[0.5].high <= e.tiers[1.0].high
    assert e.tiers[2.0].rps >= e.tiers[1.0].rps
    # the capped tier is a bound, and reads as one: at most the workload's tier
    assert e.tiers[0.5].outside == "at_most" and e.tiers[1.0].outside is None
    assert sc._range(e.tiers[0.5]).startswith(f"≤ {e.tiers[1.0].rps:,.1f} [40.3–]")
    frame = card_data(cc.make_card([e], {"ttft_ms": 1000.0}, [0.5, 1.0, 2.0], None, None).as_dict())
    fig = card_figure(frame)
    symbols = fig.data[0].marker.symbol
    # ×2: the pruned step is not judged at a looser tier; the held one is the highest measured
    assert list(symbols) == ["triangle-down", "circle", "triangle-up-open"]
    assert "▼: a stricter tier at most the workload's" in fig.layout.annotations[-1].text


def test_estimate_over_servers_is_the_geometric_mean_with_an_interval() -> None:
    values = [cc.TierCapacity(1.0, v, v, v) for v in (58.0, 60.0, 62.0)]
    est = cc.estimate(values)
    assert est is not None and est.n == 3
    assert est.rps == pytest.approx(math.exp(sum(math.log(v) for v in (58, 60, 62)) / 3))
    assert est.low < 58.0 and est.high > 62.0  # t with 2 degrees of freedom: wide
    one = cc.estimate([cc.TierCapacity(1.0, 35.0, 30.0, 40.0)])
    assert one == cc.Estimate(35.0, 30.0, 40.0, 1)
    assert cc.estimate([]) is None


def _entry(trial: int, rps: float, low: float, high: float, gpus: int, base: bool) -> cc.Entry:
    return cc.Entry(trial, f"t{trial}", base, gpus, {1.0: cc.Estimate(rps, low, high, 3)}, 100.0)


def test_plan_servers_gpus_cost_and_saving() -> None:
    base = _entry(0, 50.0, 45.0, 55.0, 1, True)
    pick = _entry(1, 120.0, 110.0, 130.0, 2, False)  # TP 2: more per server, 2 GPUs each
    card = cc.make_card([base, pick], {"ttft_ms": 1000.0}, [1.0], 1000.0, 3.6)
    b, p = card.plans[0], card.plans[1]
    assert (b.servers, b.servers_low, b.servers_high, b.gpus) == (20, 19, 23, 20)
    assert (p.servers, p.servers_low, p.servers_high, p.gpus) == (9, 8, 10, 18)
    # $3.6/GPU-h = $0.001/GPU-s; 50 req/s x 100 tokens per GPU: 1e6 / 5000 x 0.001 = $0.2
    assert b.usd_per_m_output_tokens == pytest.approx(0.2)
    assert b.usd_per_m_requests == pytest.approx(20.0)
    assert p.usd_per_m_requests == pytest.approx(2 * 0.001 / 120.0 * 1e6)
    assert p.saving == pytest.approx(1 - (2 / 120) / (1 / 50))
    assert p.gpus_saved == 2 and b.saving is None
    metrics = card.metrics()
    assert metrics["card_1_gpus"] == 18 and metrics["card_0_capacity_x1"] == 50.0
    json.dumps(card.as_dict())  # plain JSON


def test_plan_without_target_or_price_still_gives_the_saving_per_request() -> None:
    base = _entry(0, 50.0, 45.0, 55.0, 1, True)
    pick = _entry(1, 60.0, 55.0, 65.0, 1, False)
    card = cc.make_card([base, pick], {}, [1.0], None, None)
    assert card.plans[1].servers is None and card.plans[1].usd_per_m_requests is None
    assert card.plans[1].saving == pytest.approx(1 - 50 / 60)


def test_console_and_figure(tmp_path: Path) -> None:
    base = cc.Entry(
        0,
        "defaults",
        True,
        1,
        {0.5: cc.Estimate(0.0, 0.0, 9.0, 1, "below"), 1.0: cc.Estimate(50.0, 45.0, 55.0, 3)},
        100.0,
    )
    card = cc.make_card([base], {"ttft_ms": 1000.0, "percentile": 95}, [0.5, 1.0], 100.0, 2.0)
    console = Console(width=250, record=True)
    sc.print_card(card, console)
    text = console.export_text()
    assert "< 9.0 (outside the measured loads)" in text
    assert "50.0 [45.0–55.0]" in text and "2 [2–3]" in text
    frame = card_data(card.as_dict())
    assert list(frame["scale"]) == [0.5, 1.0] and list(frame["outside"]) == ["below", ""]
    fig = card_figure(frame, card.metric_slo, 100.0)
    assert len(fig.data) == 2  # the tier line and the GPU bars
    assert list(fig.data[0].y) == [9.0, 50.0]  # the bound, not 0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("plan.target_rps=0", "plan.target_rps is 0.0"),
        ("plan.target_rps=-5", "plan.target_rps is -5.0"),
        ("plan.gpu_hour_usd=-1", "plan.gpu_hour_usd is -1.0"),
        ("plan.slo_scales=[0.5,0]", "plan.slo_scales has 0"),
    ],
)
def test_plan_config_refused_in_one_line(
    make_cfg: Callable[..., TunerConfig], override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=r"^" + message.replace(".", r"\.")) as exc:
        make_cfg("+workload=chat", override)
    assert "\n" not in str(exc.value)


def test_plan_config_accepted(make_cfg: Callable[..., TunerConfig]) -> None:
    cfg = make_cfg("+workload=chat", "plan.target_rps=250", "plan.gpu_hour_usd=3.5")
    assert (cfg.plan.target_rps, cfg.plan.gpu_hour_usd, cfg.plan.slo_scales) == (
        250.0,
        3.5,
        [0.5, 1.0, 2.0],
    )


def test_peak_rate_is_the_busiest_window() -> None:
    quiet = [float(i) for i in range(0, 120, 2)]  # 0.5 req/s for two minutes
    burst = [120.0 + i * 0.1 for i in range(300)]  # then 10 req/s for 30 s
    assert sc.peak_rps(quiet + burst, 60.0) == pytest.approx((300 + 15) / 60.0)
    assert sc.peak_rps(quiet, 60.0) == pytest.approx(30 / 60.0)
    assert sc.peak_rps([0.0, 0.5, 1.0, 2.0], 60.0) == pytest.approx(4 / 2.0)  # shorter: its span
    assert sc.peak_rps([], 60.0) is None


def test_the_target_defaults_to_a_traces_peak(make_cfg: Callable[..., TunerConfig]) -> None:
    from tuner.workload.trace import load_trace

    cfg = make_cfg("+workload=trace", "plan.peak_window_s=10")
    assert cfg.workload.trace is not None
    target, source = sc.target_of(cfg)
    arrivals = load_trace(cfg.workload.trace).arrival_s
    assert target == sc.peak_rps(arrivals.tolist(), 10.0) and target is not None and target > 0
    assert source == "the trace's peak over 10 s"
    # at the trace's own speed: a replay twice as fast plans for the same traffic
    fast = make_cfg("+workload=trace", "plan.peak_window_s=10", "workload.trace.time_scale=0.5")
    assert sc.target_of(fast)[0] == pytest.approx(target)
    given = make_cfg("+workload=trace", "plan.target_rps=7")
    assert sc.target_of(given) == (7.0, "plan.target_rps")
    assert sc.target_of(make_cfg("+workload=chat")) == (None, None)


def test_a_per_gpu_study_has_a_card_counting_each_servers_gpus(
    make_cfg: Callable[..., TunerConfig], tmp_path: Path
) -> None:
    """Under ``objective=capacity_per_gpu`` (``space=gpus``) the card is drawn as under
    ``capacity`` (it was None: the card looked for ``capacity_rps`` among the objectives): a
    server's requests/s, and its GPUs (TP x DP) in the plan."""
    cfg = make_cfg(
        "+workload=chat", "objective=capacity_per_gpu", "space=gpus", "engine.gpus=[0,1]",
        "plan.target_rps=100", "workload.slo.ttft_ms=1000", "workload.slo.tpot_ms=50",
    )  # fmt: skip
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_metric_names(["capacity_per_gpu_rps", "ttft_p95_ms"])
    dirs = {}
    for n, rps in enumerate([10.0, 20.0]):  # vLLM's defaults on 1 GPU, DP=2 on 2
        study.add_trial(optuna.trial.create_trial(params={}, values=[rps / (1 + n), 50.0]))
        steps = [
            step(1.0, rps / 2, 300, 20),
            step(2.0, rps, 900, 40),
            step(4.0, rps * 1.5, 3000, 80),
        ]
        dirs[n] = tmp_path / f"trial_{n}"
        dirs[n].mkdir()
        (dirs[n] / "capacity.json").write_text(json.dumps({"steps": [s.row() for s in steps]}))
    candidates = [
        Candidate(0, ("baseline",), {}, True, (), {}),
        Candidate(1, ("capacity",), {"data_parallel_size": 2}, False, (), {}),
    ]
    card = sc.study_card(study, cfg, dirs, candidates, [])
    assert card is not None
    assert {e.trial: e.gpus_per_server for e in card.entries} == {0: 1, 1: 2}
    s0, s1 = card.plans[0].servers, card.plans[1].servers
    assert s0 is not None and s1 is not None and s1 < s0  # twice the requests/s a server
    assert card.plans[1].gpus == 2 * s1
