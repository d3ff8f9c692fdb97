"""A trial the tuner could not mark interrupted when it was stopped: one error line says so, and
the next run's recovery marks it. In this process, on the simulator."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import optuna
import pytest
from helpers.cli import FAST

import tuner.study as study_mod
from tuner import stored_trial
from tuner.config import TunerConfig
from tuner.storage import storage_url

COMMON = ["+workload=chat", "tracking=none", "study.name=stopped", *FAST]


def test_a_trial_that_could_not_be_marked_is_said_and_recovered(
    make_cfg: Callable[..., TunerConfig],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def stopped(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt("signal 15")  # as tuner.__main__'s SIGTERM handler raises it

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the storage is gone")

    monkeypatch.setattr(study_mod, "run_trial", stopped)
    monkeypatch.setattr(study_mod, "mark_interrupted", broken)
    caplog.set_level(logging.ERROR, logger="tuner")
    cfg = make_cfg(*COMMON, "study.n_trials=1")
    with pytest.raises(KeyboardInterrupt):
        study_mod.run(cfg)
    assert "could not mark trial 0 interrupted (RuntimeError('the storage is gone'))" in caplog.text
    (trial,) = optuna.load_study(study_name="stopped", storage=storage_url(cfg)).trials
    assert trial.state == optuna.trial.TrialState.RUNNING

    monkeypatch.undo()  # the next run, its tuner whole: its recovery marks the trial
    study_mod.run(make_cfg(*COMMON, "study.n_trials=0", "confirm.enabled=false"))
    trial = optuna.load_study(study_name="stopped", storage=storage_url(cfg)).trials[0]
    assert trial.state == optuna.trial.TrialState.FAIL
    assert stored_trial.failure_reason(trial) == "interrupted"
