"""``study.deadline_s`` (:mod:`tuner.deadline`): a server starts only where one more fits before
the invocation's end, going by this run's servers, else the study's stored ones."""

from __future__ import annotations

import datetime

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from tuner.deadline import Deadline, server_times

T0 = datetime.datetime(2026, 12, 8, 1, 0)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _stored(
    seconds: float, state: TrialState = TrialState.COMPLETE, **attrs: object
) -> FrozenTrial:
    return FrozenTrial(
        number=0, trial_id=0, state=state, value=1.0 if state == TrialState.COMPLETE else None,
        datetime_start=T0, datetime_complete=T0 + datetime.timedelta(seconds=seconds),
        params={}, distributions={}, user_attrs=dict(attrs), system_attrs={},
        intermediate_values={},
    )  # fmt: skip


@pytest.fixture
def study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = optuna.create_study()
    s.add_trial(_stored(300.0))  # a server measured to its end
    s.add_trial(_stored(500.0, TrialState.PRUNED))  # stopped early: a server all the same
    s.add_trial(_stored(1.0, failure_reason="precheck", launched=False))  # refused: no server
    s.add_trial(_stored(40.0, TrialState.FAIL, failure_reason="interrupted"))  # cut short
    return s


def test_the_stored_servers_are_those_that_ran_to_their_end(study: optuna.Study) -> None:
    assert sorted(server_times(study)) == [300.0, 500.0]
    assert server_times(study, before=T0) == []  # none started before T0
    assert len(server_times(study, before=T0 + datetime.timedelta(seconds=1))) == 2


def test_without_a_deadline_every_server_starts(study: optuna.Study) -> None:
    clock = Clock()
    d = Deadline(None, clock=clock)
    clock.t += 1e9
    assert d.check(study) is None


def test_the_stored_servers_and_this_runs_decide_together(study: optuna.Study) -> None:
    clock = Clock()
    d = Deadline(1000.0, clock=clock)
    clock.t += 550.0  # 450 s left, the stored servers' mean is 400
    assert d.check(study) is None
    since = d.now()
    clock.t += 60.0  # this run's first server: 60 s, 390 s left
    d.timed(since)
    assert d.ended == [60.0]
    # told as a trial too: stored after the run began, so not counted a second time
    late = _stored(60.0)
    late.datetime_start = d.since + datetime.timedelta(seconds=1)
    late.datetime_complete = late.datetime_start + datetime.timedelta(seconds=60)
    study.add_trial(late)
    assert d.check(study) is None  # 390 s left, the 3 servers' mean is 287
    clock.t += 340.0  # 50 s left
    assert d.check(study) == (
        "study.deadline_s (1000 s): 50 s left, and the study's 3 servers took 287 s on average"
    )
    clock.t += 100.0
    assert d.check(study) == (
        "study.deadline_s (1000 s): 0 s left, and the study's 3 servers took 287 s on average"
    )


def test_the_stored_mean_stops_a_server_that_would_not_fit(study: optuna.Study) -> None:
    clock = Clock()
    d = Deadline(1000.0, clock=clock)
    clock.t += 650.0  # 350 s left, the stored servers took 400 on average
    assert d.check(study) == (
        "study.deadline_s (1000 s): 350 s left, and the study's 2 servers took 400 s on average"
    )


def test_with_nothing_to_go_by_a_server_starts_while_time_is_left() -> None:
    s = optuna.create_study()
    clock = Clock()
    d = Deadline(10.0, clock=clock)
    clock.t += 9.0
    assert d.check(s) is None
    clock.t += 1.0
    assert d.check(s) == "study.deadline_s (10 s): 0 s left"
