"""Enqueued configs (the baseline, study.enqueue, warm start) run again after an interruption."""

from __future__ import annotations

import optuna

from tuner.storage import enqueue_once
from tuner.stored_study import baseline_trial

DISTS = {
    "gmu": optuna.distributions.FloatDistribution(0.1, 0.95),
    "eager": optuna.distributions.CategoricalDistribution([False, True]),
}


def test_a_failed_trial_does_not_count_but_a_finished_or_waiting_one_does() -> None:
    study = optuna.create_study()
    params = {"gmu": 0.6, "eager": True}
    assert enqueue_once(study, params)
    assert not enqueue_once(study, dict(params))  # waiting already
    t = study.ask(DISTS)
    assert t.params == params
    study.tell(t, state=optuna.trial.TrialState.FAIL)  # interrupted
    assert enqueue_once(study, params)  # so it is queued again
    t = study.ask(DISTS)
    study.tell(t, 1.0)
    assert not enqueue_once(study, params)
    assert not enqueue_once(study, {"gmu": 0.6 + 1e-12, "eager": True})
    assert enqueue_once(study, {"gmu": 0.6, "eager": False})
    assert enqueue_once(study, {"gmu": 0.61, "eager": True})


def test_a_live_baseline_ignores_a_failed_one() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"gmu": 0.92, "eager": False}, user_attrs={"baseline": True})
    t = study.ask(DISTS)
    assert baseline_trial(study, which="live") is not None  # running
    study.tell(t, state=optuna.trial.TrialState.FAIL)
    assert baseline_trial(study, which="live") is None
