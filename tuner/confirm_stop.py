"""The confirm stage's early stops (:class:`EarlyStop`, for the confirm loop of
:mod:`tuner.confirm_stage`), each from the third round on:

- ``confirm.stop_losers``: a pick whose gain over vLLM's defaults settled below
  ``confirm.min_effect`` (:func:`settled_below`: its 95 % interval, from the rounds run so far,
  lies wholly below it, so the verdict can no longer claim it) runs no more rounds, nor the
  defaults once every pick has;
- ``confirm.stop_winner``: once the verdict on the rounds run so far is a gain whose interval lies
  wholly above ``confirm.min_effect`` (:func:`settled_winner`), no candidate runs more rounds.

The rounds are judged as :mod:`tuner.confirm` judges them."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tuner.config import ObjectiveConfig, TunerConfig
from tuner.confirm import judge, round_machines, round_values, verdict
from tuner.quality_guard import Guard
from tuner.records import Candidate, ConfirmResult, TrialResult
from tuner.stored_study import ConfirmRuns
from tuner.verdict import Gain, Verdict, gain_in_blocks, gain_text

__all__ = ["EarlyStop", "settled_below", "settled_winner"]


log = logging.getLogger("tuner")


def settled_below(
    candidate: Candidate,
    runs: Sequence[tuple[int, int, TrialResult]],
    defaults: Candidate,
    defaults_runs: Sequence[tuple[int, int, TrialResult]],
    objective: ObjectiveConfig,
    bound: float = 0.0,
    others: Sequence[tuple[Candidate, Sequence[tuple[int, int, TrialResult]]]] = (),
) -> Gain | None:
    """``candidate``'s gain over vLLM's defaults on the study's first objective, from the runs
    ``(round, seed, result)`` of each so far, when its 95 % interval lies wholly below ``bound``
    (0: measured worse beyond the spread between rounds; ``confirm.min_effect``: it cannot reach
    the gain the verdict asks for, ``confirm.stop_losers``). None otherwise, and with fewer than
    2 rounds measured on a side (no interval).

    The interval is :func:`tuner.verdict.gain_in_blocks`'s: one spread between fresh servers for
    every config, pooled over this pick's rounds, the defaults' and those of ``others`` (the
    stage's other candidates, each with its runs), within each machine. After 2 rounds Welch's
    interval of the verdict has 1-2 degrees of freedom (t 4.3-12.7); pooled over 4 configs it
    has 4 (t 2.8). Over the confirm stages of 17 quick starts of 2026-12-05 and -06 (41 picks,
    ``benchmarks/confirm_stop.py``) 13 picks settled short of ``min_effect`` after 2 rounds
    pooled, 8 with Welch's, and no verdict changed. A stop only takes rounds away from a pick,
    so the verdict can claim no gain it would not have claimed; its rounds so far are still
    judged by :mod:`tuner.confirm` as every pick's are."""
    first = objective.objectives[0]
    higher = first.direction == "maximize"

    def measured(
        c: Candidate, rs: Sequence[tuple[int, int, TrialResult]]
    ) -> list[tuple[str | None, float]]:
        judged = judge(c, rs, objective)
        values = round_values(judged, first.metric, higher)
        pairs = zip(round_machines(judged), values, strict=True)
        return [(m, v) for m, v in pairs if v is not None]

    mine, base = measured(candidate, runs), measured(defaults, defaults_runs)
    if len(mine) < 2 or len(base) < 2:
        return None
    rest = [measured(c, rs) for c, rs in others]
    g = gain_in_blocks(mine, base, higher, spread=rest)
    return g if g.high is not None and g.high < bound else None


def settled_winner(
    candidates: Sequence[Candidate],
    judged: Sequence[ConfirmResult],
    objective: ObjectiveConfig,
    min_effect: float,
    rounds: int,
) -> Verdict | None:
    """The verdict on the rounds run so far (:func:`tuner.confirm.verdict` over ``judged``, the
    candidates' results) when it is settled on a gain: a claimed gain (``gain``) whose 95 %
    interval lies wholly above ``min_effect`` and whose point gain is the best of every pick's, so
    a further round could neither take the claim away beyond the spread between rounds nor, short
    of an unclaimed pick overtaking it in one round, change which config is recommended. None
    otherwise.

    The interval is the verdict's own (Welch's, per machine: :func:`tuner.verdict.gain_by_machine`),
    so the stage's verdict after the stop is the one checked here. Its first look at 2 + 2 rounds
    (t 4.3-12.7) asks for a low end at ``min_effect``, not above 0: a stop on a gain the third round
    would have taken away needs a round-2 interval wrong by more than ``min_effect``."""
    v = verdict(judged, candidates, objective, min_effect, rounds)
    g = v.gain
    if v.kind != "gain" or g is None or g.low is None or g.value is None or g.low < min_effect:
        return None
    values = [o.value for t, o in v.gains.items() if t != v.recommended and o.value is not None]
    return v if all(x <= g.value for x in values) else None


@dataclass
class EarlyStop:
    """The early stops over one confirm stage (the module docstring): from the third round on,
    ``confirm.stop_losers`` (a pick settled below ``confirm.min_effect``, :func:`settled_below`,
    runs no more rounds, nor the defaults once every pick has) and ``confirm.stop_winner`` (a gain
    settled above it, :func:`settled_winner`: no candidate runs more rounds); the rounds each
    ran, the log lines."""

    cfg: TunerConfig
    candidates: Sequence[Candidate]
    stored: ConfirmRuns
    """Servers an earlier run of the stage stored: taken, not skipped."""
    guard: Guard
    """The stage's quality guard: :meth:`result` judges a candidate with it."""
    stopped: dict[int, int] = field(default_factory=dict)
    won: int | None = None
    """The round from which ``confirm.stop_winner`` stopped the stage."""
    _looked: int = 0

    def skip(
        self,
        c: Candidate,
        rnd: int,
        runs: Mapping[int, Sequence[tuple[int, int, TrialResult]]],
        step: str,
    ) -> bool:
        """Whether candidate ``c`` runs no round ``rnd`` (``step``: "confirm 8/9" for the log):
        stopped before, or from the third round on settled below ``confirm.min_effect``, or the
        stage settled on a gain above it."""
        if c.trial in self.stopped:
            return True
        base = next((d for d in self.candidates if d.baseline), None)
        if base is None or rnd < 3:
            return False
        if self.stored.get(c.trial, rnd) is not None:
            return False
        if self._winner(rnd, runs, step):
            self.stopped[c.trial] = rnd - 1
            return True
        if not self.cfg.confirm.stop_losers:
            return False
        effect, name = self.cfg.confirm.min_effect, self.cfg.objective.objectives[0].metric
        why = f"round {rnd}, trial {c.trial} ({', '.join(c.picks)}) not run, nor its later rounds"

        def settled(o: Candidate) -> Gain | None:
            rest = [
                (x, runs[x.trial]) for x in self.candidates if x.trial not in (o.trial, base.trial)
            ]
            return settled_below(
                o, runs[o.trial], base, runs[base.trial], self.cfg.objective, effect, rest
            )

        if c.trial == base.trial:  # the defaults: once no pick runs this round (ran, or will)
            others = [o for o in self.candidates if o.trial != base.trial]
            if not others or not all(
                o.trial in self.stopped
                or (all(r != rnd for r, _, _ in runs[o.trial]) and settled(o) is not None)
                for o in others
            ):
                return False
            self.stopped[c.trial] = rnd - 1
            log.info("%s: %s: every pick has stopped (confirm.stop_losers)", step, why)
            return True
        if (below := settled(c)) is None:
            return False
        self.stopped[c.trial] = rnd - 1
        where = (
            "below vLLM's defaults beyond the spread between rounds"
            if below.high is not None and below.high < 0
            else f"short of confirm.min_effect (+{effect:.0%}) beyond the spread between rounds"
        )
        log.info(
            "%s: %s: after %d and %d rounds it is %s, %s, the spread pooled over the stage's %d "
            "configs (confirm.stop_losers)", step, why, below.n_pick, below.n_base, where,
            gain_text(below, name), len(self.candidates),
        )  # fmt: skip
        return True

    def _winner(
        self, rnd: int, runs: Mapping[int, Sequence[tuple[int, int, TrialResult]]], step: str
    ) -> bool:
        """``confirm.stop_winner``: whether the stage stops from round ``rnd`` on a settled gain;
        looked at once a round, before its first server, on the rounds run before it."""
        if self.won is not None:
            return True
        if not self.cfg.confirm.stop_winner or self._looked == rnd:
            return False
        self._looked = rnd
        done = rnd - 1
        judged = [self.result(c, runs[c.trial], min(done, self.rounds(c))) for c in self.candidates]
        cc = self.cfg.confirm
        v = settled_winner(self.candidates, judged, self.cfg.objective, cc.min_effect, cc.rounds)
        if v is None or v.gain is None:
            return False
        self.won = rnd
        pick = next(c for c in self.candidates if c.trial == v.recommended)
        log.info(
            "%s: no candidate runs round %d or later: after %d rounds trial %d (%s) gains %s over "
            "vLLM's defaults, its interval wholly above confirm.min_effect (+%.0f%%) "
            "(confirm.stop_winner)", step, rnd, done, pick.trial, ", ".join(pick.picks),
            gain_text(v.gain, v.metric), 100 * cc.min_effect,
        )  # fmt: skip
        return True

    def result(
        self, c: Candidate, runs: Sequence[tuple[int, int, TrialResult]], rounds: int | None = None
    ) -> ConfirmResult:
        """Candidate ``c``'s result over its ``runs`` as the stage judges it
        (:func:`tuner.confirm.judge`, then the quality guard over ``rounds``, by default the
        rounds it ran)."""
        n = self.rounds(c) if rounds is None else rounds
        return self.guard.judge(judge(c, runs, self.cfg.objective), c, n)

    def rounds(self, c: Candidate) -> int:
        """The rounds candidate ``c`` ran."""
        return self.stopped.get(c.trial, self.cfg.confirm.rounds)
