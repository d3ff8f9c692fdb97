"""``confirm.stop_losers``: the confirm stage's early stop (:class:`Losers`, for the confirm
loop of :mod:`tuner.study`). From the third round on, a pick whose gain over vLLM's defaults
settled below ``confirm.min_effect`` (:func:`settled_below`: its 95 % interval, from the rounds
run so far, lies wholly below it, so the verdict can no longer claim it) runs no more rounds,
nor the defaults once every pick has. The rounds are judged as :mod:`tuner.confirm` judges them."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tuner.config import ObjectiveConfig, TunerConfig
from tuner.confirm import judge, round_machines, round_values
from tuner.records import Candidate, TrialResult
from tuner.stored_study import ConfirmRuns
from tuner.verdict import Gain, gain_in_blocks, gain_text

__all__ = ["Losers", "settled_below"]

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


@dataclass
class Losers:
    """``confirm.stop_losers`` over one confirm stage: from the third round on, a pick settled
    below ``confirm.min_effect`` (:func:`settled_below`: the verdict can no longer claim it) runs
    no more rounds, nor the defaults once every pick has; the rounds each ran, the log line."""

    cfg: TunerConfig
    candidates: Sequence[Candidate]
    stored: ConfirmRuns
    """Servers an earlier run of the stage stored: taken, not skipped."""
    stopped: dict[int, int] = field(default_factory=dict)

    def skip(
        self,
        c: Candidate,
        rnd: int,
        runs: Mapping[int, Sequence[tuple[int, int, TrialResult]]],
        step: str,
    ) -> bool:
        """Whether candidate ``c`` runs no round ``rnd`` (``step``: "confirm 8/9" for the log):
        stopped before, or from the third round on settled below ``confirm.min_effect``."""
        if c.trial in self.stopped:
            return True
        base = next((d for d in self.candidates if d.baseline), None)
        if not self.cfg.confirm.stop_losers or base is None or rnd < 3:
            return False
        if self.stored.get(c.trial, rnd) is not None:
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

    def rounds(self, c: Candidate) -> int:
        """The rounds candidate ``c`` ran."""
        return self.stopped.get(c.trial, self.cfg.confirm.rounds)
