"""The arithmetic of ``benchmarks/capacity_cost.py``: replays a trial beyond the workload's own,
their medians over all trials, the losing ones (censored above) and the others, and the targets'
PASS / FAIL / n/a."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def cc() -> Any:
    return load_benchmark("capacity_cost")


def _trial(steps: float | None, censored: float | None = 0.0, **kw: Any) -> dict[str, Any]:
    row = {"steps": steps, "censored": censored, "counted": True, "server_s": 0.0}
    return row | {"baseline": False, "capacity_rps": None} | kw


def test_replay_medians_split_losing_trials_from_the_others(cc: Any) -> None:
    trials = [
        _trial(6),  # the baseline's full bracket
        _trial(2, -1.0),  # lost at the incumbent's load: own replay + probe
        _trial(1, -1.0),  # lost at its own load already
        _trial(2, -1.0),
        _trial(4, 1.0),  # held everywhere tried
        _trial(None, None),  # pruned at its own load: no capacity search, in no median
    ]
    m = cc.replay_medians(trials)
    assert m["all"] == {"n": 5, "median_replays": 2.0, "median_extra_replays": 1.0}
    assert m["losing"] == {"n": 3, "median_replays": 2.0, "median_extra_replays": 1.0}
    assert m["others"] == {"n": 2, "median_replays": 5.0, "median_extra_replays": 4.0}


def test_without_losing_trials_their_target_is_not_judged(cc: Any) -> None:
    probe = {"replays": cc.replay_medians([_trial(5), _trial(3)])}
    checks = {c["target"]: c for c in cc.targets(probe, rel_best=0.01)}
    assert checks["median extra replays per losing trial"]["pass"] is None
    assert checks["median extra replays per trial"]["measured"] == 3.0
    assert checks["median extra replays per trial"]["pass"] is True  # 3 <= 3
    assert checks["best capacity vs the study without the probe"]["pass"] is True


@pytest.mark.parametrize(
    ("losing", "others", "rel_best", "expected"),
    [
        # losing: median 2.5 replays -> 1.5 extra; all: median 3 -> 2 extra; -5 % exactly
        ([2, 3], [4, 7], -0.05, [True, True, True]),
        # losing: 3 -> 2 extra; all: median 4.5 -> 3.5 extra; just past -5 %
        ([3, 3], [6, 7], -0.051, [False, False, False]),
        # a higher best passes
        ([2, 2], [2, 9], 0.20, [True, True, True]),
    ],
)
def test_targets(
    cc: Any, losing: list[int], others: list[int], rel_best: float, expected: list[bool]
) -> None:
    trials = [_trial(s, -1.0) for s in losing] + [_trial(s) for s in others]
    probe = {"replays": cc.replay_medians(trials)}
    assert [c["pass"] for c in cc.targets(probe, rel_best)] == expected


def test_summary_counts_gpu_seconds_per_counted_trial(cc: Any) -> None:
    trials = [
        _trial(5, server_s=30.0, baseline=True, capacity_rps=12.0),
        _trial(2, -1.0, server_s=10.0, capacity_rps=3.0),
        _trial(None, None, counted=False, server_s=0.0),  # refused before launch
    ]
    s = cc.summary(trials, wall_s=61.23, best=12.0)
    assert (s["trials"], s["counted"], s["without_steps"]) == (3, 2, 1)
    assert s["gpu_s_per_counted_trial"] == pytest.approx(20.0)
    assert s["wall_s"] == 61.2
    assert s["baseline_capacity_rps"] == [12.0]
    assert cc.rel_diff(11.4, 12.0) == pytest.approx(-0.05)
    assert cc.rel_diff(None, 12.0) is None
    assert cc.rel_diff(11.0, None) is None
