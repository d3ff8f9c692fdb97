"""The confirm verdict: a gain over vLLM's defaults with its 95 % interval over the rounds, and the
rule that turns the gains into what is recommended."""

from __future__ import annotations

import json
import math

import pytest

from tuner.verdict import Arm, Gain, Verdict, decide, gain, line, pct


def test_a_clear_gain_has_an_interval_above_zero() -> None:
    g = gain([110.0, 111.0, 109.5], [100.0, 101.0, 99.0], higher=True)
    assert g.value == pytest.approx(math.exp(math.log(110.166) - math.log(100.0)) - 1, abs=2e-3)
    assert g.low is not None and g.high is not None
    assert 0 < g.low < g.value < g.high
    assert (g.n_pick, g.n_base, g.why) == (3, 3, None)
    assert g.claimed(0.03) and not g.below


def test_a_gain_inside_the_noise_is_not_claimed() -> None:
    # +2.7 % while the defaults' own spread between fresh servers is ±3 %
    g = gain([102.0, 105.5, 100.8], [97.0, 103.0, 100.0], higher=True)
    assert g.value == pytest.approx(0.027, abs=0.002)
    assert g.low is not None and g.low < 0 < (g.high or 0)
    assert not g.claimed(0.0) and not g.below


def test_a_loss_lies_below_zero() -> None:
    g = gain([90.0, 91.0, 89.5], [100.0, 101.0, 99.0], higher=True)
    assert g.value is not None and g.value < 0
    assert g.high is not None and g.high < 0 and g.below
    assert not g.claimed(0.0)


def test_a_minimised_metric_gains_when_it_goes_down() -> None:
    # TTFT p95 500 -> 400 ms: 1.25x better, a positive gain
    g = gain([400.0, 405.0, 398.0], [500.0, 505.0, 495.0], higher=False)
    assert g.value == pytest.approx(500 / 401 - 1, abs=0.005)
    assert g.low is not None and g.low > 0 and g.claimed(0.03)
    worse = gain([500.0, 505.0, 495.0], [400.0, 405.0, 398.0], higher=False)
    assert worse.value is not None and worse.value < 0 and worse.below
    # the interval is the maximised one's mirrored: (1 + g)(1 + g') = 1 at each end
    up = gain([500.0, 505.0, 495.0], [400.0, 405.0, 398.0], higher=True)
    assert up.low is not None and worse.high is not None
    assert (1 + up.low) * (1 + worse.high) == pytest.approx(1.0)


def test_too_few_rounds_give_no_interval_and_say_so() -> None:
    one = gain([110.0], [100.0, 101.0], higher=True)
    assert one.value == pytest.approx(110 / math.sqrt(100 * 101) - 1)
    assert one.low is None and one.high is None and "fewer than 2 rounds" in (one.why or "")
    assert not one.claimed(0.0)
    none = gain([110.0, 111.0], [], higher=True)
    assert none.value is None and "no round measured vLLM's defaults" in (none.why or "")
    zero = gain([110.0, 111.0], [0.0, 5.0], higher=True)
    assert zero.value is None and "0" in (zero.why or "")
    flat = gain([110.0, 110.0], [100.0, 100.0], higher=True)
    assert flat.low is None and "no spread" in (flat.why or "")


def test_the_min_effect_rule() -> None:
    # a tight +1.5 %: real (interval above 0) but under a 3 % min effect
    g = gain([101.5, 101.6, 101.4], [100.0, 100.1, 99.9], higher=True)
    assert g.low is not None and g.low > 0
    assert not g.claimed(0.03) and g.claimed(0.01)


def _arm(trial: int, values: list[float | None], held: bool = True, base: bool = False) -> Arm:
    return Arm(trial, tuple(values), held, base)


BASE = _arm(0, [100.0, 101.0, 99.0], base=True)


def test_decide_recommends_the_best_claimed_pick_on_the_metric() -> None:
    arms = [
        _arm(3, [91.2, 92.0, 90.5]),
        _arm(6, [168.5, 170.0, 167.1]),
        _arm(0, [80, 81, 79.5], base=True),
    ]
    v = decide(arms, "capacity_rps", True, 0.03, 3)
    assert (v.kind, v.recommended, v.shown, v.baseline) == ("gain", 6, 6, 0)
    assert line(v).startswith("Verdict: +")
    assert "capacity_rps (95 % CI " in line(v) and "3 rounds each) → gain: trial 6" in line(v)
    # a minimised metric: the lowest wins
    low = [
        _arm(3, [300.0, 301, 299]),
        _arm(6, [200.0, 201, 199]),
        _arm(0, [400.0, 401, 399], base=True),
    ]
    assert decide(low, "ttft_p95_ms", False, 0.03, 3).recommended == 6


def test_decide_prefers_a_claimed_gain_over_a_better_but_noisy_one() -> None:
    noisy = _arm(3, [150.0, 80.0, 130.0])  # best on average, but within the noise
    steady = _arm(6, [110.0, 111.0, 109.0])
    v = decide([noisy, steady, BASE], "goodput", True, 0.03, 3)
    assert v.kind == "gain" and v.recommended == 6
    assert not v.gains[3].claimed(0.03)


def test_decide_no_gain_keeps_the_defaults() -> None:
    v = decide(
        [_arm(6, [102.0, 105.5, 100.8]), _arm(0, [97.0, 103.0, 100.0], base=True)],
        "goodput",
        True,
        0.03,
        3,
    )
    assert (v.kind, v.recommended, v.shown) == ("no_gain", 0, 6)
    text = line(v)
    assert text.startswith("Verdict: no significant gain: +2.8 % goodput (95 % CI \u2212")
    assert text.endswith("3 rounds each) — keep vLLM's defaults (trial 0)")
    # real but small: said so
    small = decide(
        [_arm(6, [101.5, 101.6, 101.4]), _arm(0, [100, 100.1, 99.9], base=True)],
        "goodput",
        True,
        0.03,
        3,
    )
    assert small.kind == "no_gain" and "under confirm.min_effect 3%" in line(small)
    # no pick held: the defaults, and no gain shown
    none = decide([_arm(6, [150.0, 151.0, 149.0], held=False), BASE], "goodput", True, 0.03, 3)
    assert (none.kind, none.recommended, none.gain) == ("no_gain", 0, None)
    assert "no pick held in every round" in line(none)


def test_decide_when_the_defaults_failed_under_stress() -> None:
    # the defaults failed to run in two rounds: no interval, the best held pick, flagged
    failed = _arm(0, [100.0, None, None], held=False, base=True)
    v = decide([_arm(6, [150.0, 151.0, 149.0]), failed], "goodput", True, 0.03, 3)
    assert (v.kind, v.recommended) == ("undetermined", 6)
    assert v.note is not None and "demoted under stress" in v.note and "1 round(s)" in v.note
    assert "not proven better than vLLM's defaults) → trial 6" in line(v)
    # demoted (an SLO missed) but measured every round: the rule still holds for a clear gain
    demoted = _arm(0, [100.0, 101.0, 99.0], held=False, base=True)
    v = decide([_arm(6, [150.0, 151.0, 149.0]), demoted], "goodput", True, 0.03, 3)
    assert v.kind == "gain" and v.recommended == 6 and "demoted" in (v.note or "")
    # ... and without a claimed gain it is undetermined, not "keep the defaults"
    v = decide([_arm(6, [101.0, 99.0, 100.5]), demoted], "goodput", True, 0.03, 3)
    assert (v.kind, v.recommended) == ("undetermined", 6)
    # a pick below the defaults is never recommended, even then
    v = decide([_arm(6, [80.0, 81.0, 79.0]), demoted], "goodput", True, 0.03, 3)
    assert (v.kind, v.recommended) == ("undetermined", None)
    assert "nothing recommended" in line(v)


def test_decide_without_rounds_or_a_baseline_is_undetermined() -> None:
    # confirm.rounds=1: a point gain, no interval
    one = decide([_arm(6, [110.0]), _arm(0, [100.0], base=True)], "goodput", True, 0.03, 1)
    assert (one.kind, one.recommended) == ("undetermined", 6)
    assert one.gain is not None and one.gain.low is None
    # ... and a pick measured below the defaults then: the defaults
    below = decide([_arm(6, [90.0]), _arm(0, [100.0], base=True)], "goodput", True, 0.03, 1)
    assert (below.kind, below.recommended) == ("undetermined", 0)
    assert "keep vLLM's defaults" in line(below)
    # no baseline pick: nothing to compare with
    alone = decide([_arm(3, [90.0, 91.0]), _arm(6, [110.0, 111.0])], "goodput", True, 0.03, 2)
    assert (alone.kind, alone.recommended, alone.gains) == ("undetermined", 6, {})
    assert "no baseline pick" in (alone.note or "")


def test_the_verdict_survives_json() -> None:
    v = decide([_arm(6, [110.0, 111.0, 109.5]), BASE], "goodput", True, 0.03, 3)
    back = Verdict.from_dict(json.loads(json.dumps(v.as_dict())))
    assert back == v and isinstance(back.gains[6], Gain)


def test_pct_uses_a_true_minus() -> None:
    assert (pct(0.081), pct(-0.015), pct(0.0)) == ("+8.1", "\u22121.5", "+0.0")


def test_when_every_pick_is_the_defaults() -> None:
    v = decide([BASE], "goodput", True, 0.03, 3)
    assert (v.kind, v.recommended, v.gains) == ("no_gain", 0, {})
    assert line(v) == (
        "Verdict: every pick is vLLM's defaults, nothing to compare — keep vLLM's defaults (trial 0)"
    )
