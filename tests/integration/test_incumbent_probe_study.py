"""The incumbent probe in a study on the simulator (in process): the second trial's first capacity
step after its own load is the first trial's capacity, replayed until it may serve no more than the
first; each trial's capacity is bracketed or, if it lost there or below serving no more, censored
above."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.capacity import BINDING_SLOS

from tuner import study as study_mod
from tuner.config import TunerConfig

pytestmark = pytest.mark.integration

SMALL = [
    *BINDING_SLOS,
    "confirm.enabled=false",
    "tracking=none",
    "space=none",
    "study.n_trials=2",
    # the workload's own replay (4 in flight, far below the capacity) of 30 requests, not 100
    # (~5 s of each trial); each later step still measures 100 (objective.capacity.requests)
    "workload.num_requests=30",
    "objective.capacity.requests=100",
    # 6: the first trial's search is its own load, the predicted start (4.0x since the streams
    # were stratified), then narrow climbs of one slot (0.25x) each; with 5, a capacity at 4.75x
    # or above left no step to fail, and the trial was censored ">=" (a fresh-clone CI run on 2
    # cores, 2026-12-05). In 8 runs of the same first trial that day (test_capacity_study.py)
    # one held at 4.0, 4.25, 4.5 and 4.75x and failed at 5.0x: 6 steps. (Before, at 5: a CI run
    # on 2026-12-03 held its 4th step at 67.8 req/s.)
    "objective.capacity.max_steps=6",
]


def test_the_second_trial_probes_the_first_trials_capacity(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    outcome = study_mod.run(make_cfg(*SMALL))
    first, second = outcome.study.trials
    assert outcome.study.study_name == "chat-qwen3-8b-sim-capacity"
    m0 = first.user_attrs["metrics"]
    assert m0["capacity_censored"] == 0.0 and m0["capacity_rps"] > 0
    steps = json.loads((Path(second.user_attrs["trial_dir"]) / "capacity.json").read_text())
    factors = [s["factor"] for s in steps["steps"]]
    # a closed loop of 4: the incumbent's factor runs at a whole concurrency
    assert factors[0] == 1.0
    assert factors[1] == math.ceil(4 * m0["capacity_factor"]) / 4
    m1 = second.user_attrs["metrics"]
    probe = steps["steps"][1]
    # a closed loop's step at the incumbent's load runs on while it may serve more than the
    # incumbent: pruned only once bound (Little's law) to serve no more, else its rate decides
    if probe["pruned"] is not None:
        assert "serves at most" in probe["pruned"] and not probe["held"]
        assert len(factors) == 2 and m1["capacity_censored"] == -1.0
    elif not probe["held"] and probe["rps"] <= m0["capacity_rps"]:
        # lost there, serving no more than the incumbent: one step, censored above; the estimate
        # at most the bound, itself at most the incumbent's rate
        assert len(factors) == 2 and m1["capacity_censored"] == -1.0
        assert m1["capacity_rps"] <= m1["capacity_rps_high"] <= m0["capacity_rps"] + 1e-9
    elif not probe["held"]:  # lost there yet served more (the same config as the incumbent, at
        # a concurrency rounded up past its crossing, can): walked down, each step below pruned
        # alike, until one held (measured) or one lost serving no more (censored above)
        below = steps["steps"][2:]
        assert below and all("serves at most" in s["pruned"] for s in below if s["pruned"])
        if m1["capacity_censored"] == -1.0:
            assert not below[-1]["held"]
            assert below[-1]["pruned"] or below[-1]["rps"] <= m0["capacity_rps"]
        else:
            assert m1["capacity_censored"] == 0.0 and m1["capacity_rps"] <= probe["rps"]
    else:
        assert m1["capacity_censored"] >= 0.0
