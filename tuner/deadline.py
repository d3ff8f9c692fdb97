"""``study.deadline_s``: a hard end for one invocation, search and confirm stage together, for a
GPU held for a fixed window (a reservation, a spot instance, a lent machine's session).

A server (a search trial's, or a confirm server) starts only where one more fits before the end,
going by the mean wall time of the servers this study has run: the trials stored before this
run (from ask to tell: their start-up, capacity search and teardown; refused and interrupted
ones left out) and this run's servers that ended. With none to go by, a server starts while any
time is left. No server is cut short by the deadline: where a kill at the window's end would
lose the running server and mark its trial interrupted, nothing measured is lost. A server may
take longer than the mean (a long_docs defaults' server of 5 replays against one of 2), so a run
whose window is a machine's should still end by a kill after the deadline. The same command
continues the study (the search's next trials, the confirm servers not stored;
:class:`tuner.stored_study.ConfirmRuns`).

``study.timeout_s`` is the soft budget (no new trial after it, running ones finish, the confirm
stage still runs); a screen's rounds end on the defaults by it (:mod:`tuner.screen_resume`).
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna

from tuner import stored_trial

__all__ = ["Deadline", "server_times"]

MEASURED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def server_times(study: optuna.Study, before: datetime.datetime | None = None) -> list[float]:
    """Wall times (s) of the study's stored trials that ran a server to its end (COMPLETE or
    PRUNED, not refused before launch), those started before ``before`` (naive local time, as
    Optuna stores it) where given."""
    return [
        (t.datetime_complete - t.datetime_start).total_seconds()
        for t in study.get_trials(deepcopy=False, states=MEASURED)
        if t.datetime_start is not None
        and t.datetime_complete is not None
        and (before is None or t.datetime_start < before)
        and not stored_trial.rejected_before_launch(t)
    ]


@dataclass
class Deadline:
    """One invocation's window: ``seconds`` from ``begun`` (None: no deadline)."""

    seconds: float | None = None
    clock: Callable[[], float] = time.monotonic
    begun: float = field(init=False)
    since: datetime.datetime = field(init=False)
    """The run's start as Optuna dates a trial: trials that started before it are the stored."""
    ended: list[float] = field(default_factory=list)
    """Wall times of this run's servers that ended (:meth:`timed`)."""

    def __post_init__(self) -> None:
        self.begun = self.clock()
        self.since = datetime.datetime.now()

    def now(self) -> float:
        return self.clock()

    def timed(self, since: float) -> None:
        """A server this run started at ``since`` (:meth:`now`) has ended."""
        self.ended.append(self.clock() - since)

    def check(self, study: optuna.Study) -> str | None:
        """None where a server may start, else why not (for the log)."""
        if self.seconds is None:
            return None
        left = self.begun + self.seconds - self.clock()
        times = server_times(study, self.since) + self.ended
        typical = statistics.fmean(times) if times else 0.0
        if left > typical:
            return None
        took = f", and the study's {len(times)} servers took {typical:.0f} s on average"
        return f"study.deadline_s ({self.seconds:g} s): {max(left, 0.0):.0f} s left" + (
            took if times else ""
        )
