"""A study with ``study.prescreen``: the simulator's best configs run first, once per study."""

from __future__ import annotations

from collections.abc import Callable

import optuna
import pytest
from helpers.cli import FAST
from helpers.trials import counted

import tuner.storage as storage_mod
import tuner.study as study_mod
from tuner.config import TunerConfig
from tuner.stored_study import prescreen_summary

pytestmark = pytest.mark.integration

ARGS = [
    "+workload=chat",
    "engine=sim",
    "tracking=none",
    "confirm.enabled=false",
    "study.prescreen.trials=20",
    "study.prescreen.top=1",
    *FAST,
    "objective=goodput",  # after FAST's: the last value of a group wins
]


def _study(cfg: TunerConfig) -> optuna.Study:
    return optuna.load_study(
        study_name=storage_mod.study_name(cfg), storage=storage_mod.storage_url(cfg)
    )


def test_the_prescreen_pick_runs_after_the_baseline_and_only_once(
    make_cfg: Callable[..., TunerConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_cfg(*ARGS, "study.n_trials=2")
    study_mod.run(cfg)
    study = _study(cfg)
    summary = prescreen_summary(study)
    assert summary is not None
    assert summary["trials"] == 20 and summary["enqueued"] == 1
    base, pick = study.trials[:2]
    assert base.user_attrs["baseline"] is True
    predicted = pick.user_attrs["prescreen"]  # the simulator's prediction beside the measurement
    assert predicted["goodput"] == min(predicted["goodput_stream1"], predicted["goodput_stream2"])
    assert pick.state == optuna.trial.TrialState.COMPLETE and pick.user_attrs["launched"]
    assert pick.user_attrs["metrics"]["goodput"] > 0

    def again(*_: object, **__: object) -> None:
        raise AssertionError("the prescreen ran again on a resumed study")

    monkeypatch.setattr(storage_mod, "prescreen", again)
    study_mod.run(make_cfg(*ARGS, "study.n_trials=1"))
    study = _study(cfg)
    assert len(counted(study.trials)) == 3 and prescreen_summary(study) == summary
    assert "prescreen" not in study.trials[2].user_attrs  # the sampler's own draw
