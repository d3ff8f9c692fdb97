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

from tuner import stored_trial
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
    # the second trial a config other than vLLM's defaults (a baseline is never censored, the
    # last test): --block-size 32, which the simulator serves about as the defaults
    search = [o for o in SMALL if o != "space=none"]
    outcome = study_mod.run(make_cfg(*search, "space=default", "study.enqueue=[{block_size:32}]"))
    first, second = outcome.study.trials
    assert stored_trial.is_baseline(first) and second.params["block_size"] == 32
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


def test_a_baseline_run_after_a_capacity_is_measured_gets_its_own(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    """vLLM's defaults (the baseline trial) run once the study has a capacity to beat (a grid's
    cell of the defaults with ``study.baseline_first=false``, or a baseline enqueued late): its
    search tries the incumbent's load first, as a prediction, and brackets its own crossing below
    it instead of ending there censored above. The incumbent here is a stored trial no config
    can reach (8x the workload's load, 1000 req/s): a search trial would stop at it, capped."""
    small = [o for o in SMALL if not o.startswith("study.n_trials=")]
    study = study_mod.run(make_cfg(*small, "study.n_trials=0")).study  # stored, no trial yet
    best = study.ask()
    best.set_user_attr("metrics", {"capacity_rps": 1000.0, "capacity_factor": 8.0,
                                   "capacity_censored": 0.0, "ttft_p95_ms": 50.0})  # fmt: skip
    system, user = stored_trial.constraint_attrs({"error_rate": -0.05})
    for k, v in system.items():
        best.storage.set_trial_system_attr(best._trial_id, k, v)
    for k, v in user.items():
        best.set_user_attr(k, v)
    study.tell(best, [1000.0, 50.0])

    outcome = study_mod.run(make_cfg(*small, "study.n_trials=1"))
    baseline = outcome.study.trials[-1]
    assert stored_trial.is_baseline(baseline)
    steps = json.loads((Path(baseline.user_attrs["trial_dir"]) / "capacity.json").read_text())
    factors = [s["factor"] for s in steps["steps"]]
    assert factors[:2] == [1.0, 8.0]  # its own load, then the incumbent's
    assert not steps["steps"][1]["held"]
    m = baseline.user_attrs["metrics"]
    assert m["capacity_censored"] == 0.0  # bracketed below the incumbent: its own capacity
    assert 0 < m["capacity_rps"] < 1000.0 and len(factors) > 2
