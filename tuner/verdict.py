"""The confirm stage's verdict: is a pick's gain over vLLM's defaults real, or inside the noise?

The confirm stage runs every candidate (the picks and vLLM's defaults) once per round, each run on
a fresh server, the rounds interleaved; a round's value of a candidate is the worst over that
round's stress runs. On the study's first objective metric, :func:`gain` compares a pick's round
values with the defaults': the relative gain ``exp(mean log pick − mean log defaults) − 1`` (for a
minimised metric the other way round, so a positive gain is always better) and its 95 % interval
from Welch's t on the log values (``scipy.stats.ttest_ind(equal_var=False)``): the spread between
fresh servers of one config (±3 % for vLLM's defaults on an H200) is the noise a gain must beat.

:func:`decide` is the rule (pure: numbers in, verdict out):

- ``gain``: a pick that held in every round has a *claimed* gain — its interval's low end is above
  0 and its point gain is at least ``min_effect`` (``confirm.min_effect``). Of the picks with a
  claimed gain, the one best on the metric (geometric mean over its rounds) is recommended.
- ``no_gain``: no claimed gain, and vLLM's defaults held in every round and were measured in 2
  rounds or more: "no significant gain — keep vLLM's defaults"; the defaults are recommended.
- ``undetermined``: no claimed gain and the comparison cannot keep the defaults either — no
  ``baseline`` pick, fewer than 2 rounds with a value on a side (``confirm.rounds=1``, or the
  defaults failed under stress), a value a log cannot take (0), or the defaults demoted under
  stress. The best held pick is recommended, flagged as not proven better, unless it measured below
  the defaults (its interval, or without one its point gain, below 0); then the defaults if they
  held, else nothing.

A pick whose interval lies entirely below 0 is never recommended: a claimed gain is above 0, and
``undetermined`` leaves such a pick out.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "CONFIDENCE",
    "VERDICTS",
    "Arm",
    "Gain",
    "Verdict",
    "decide",
    "gain",
    "gain_by_machine",
    "gain_in_blocks",
    "gain_of_one",
    "gain_text",
    "line",
    "pct",
]

CONFIDENCE = 0.95
VERDICTS = ("gain", "no_gain", "undetermined")


@dataclass(frozen=True)
class Gain:
    """A pick against vLLM's defaults on one metric, over the confirm rounds. Fractions: +0.081 is
    8.1 % better (higher for a maximised metric, lower for a minimised one)."""

    value: float | None
    """The point gain; None without a usable value on both sides."""
    low: float | None = None
    high: float | None = None
    """The :data:`CONFIDENCE` interval; None when it cannot be computed (``why`` says why)."""
    n_pick: int = 0
    n_base: int = 0
    """Rounds with a value on each side."""
    why: str | None = None

    def claimed(self, min_effect: float) -> bool:
        """The rule: the interval above 0 and the point gain at least ``min_effect``."""
        return (
            self.low is not None
            and self.value is not None
            and self.low > 0
            and self.value >= min_effect
        )

    @property
    def below(self) -> bool:
        """Measured worse than the defaults: the interval below 0, or without one the point."""
        if self.high is not None:
            return self.high < 0
        return self.value is not None and self.value < 0


def _logs(values: Sequence[float]) -> list[float] | None:
    if any(not (v > 0 and math.isfinite(v)) for v in values):
        return None
    return [math.log(v) for v in values]


def gain(
    pick: Sequence[float], base: Sequence[float], higher: bool, confidence: float = CONFIDENCE
) -> Gain:
    """The gain of ``pick`` over ``base`` (each the metric per round) and its interval: Welch's t
    on the log values, so the gain is a ratio of geometric means and the interval is asymmetric."""
    n_pick, n_base = len(pick), len(base)
    if not pick or not base:
        side = "the pick" if not pick else "vLLM's defaults"
        return Gain(None, n_pick=n_pick, n_base=n_base, why=f"no round measured {side}")
    lp, lb = _logs(pick), _logs(base)
    if lp is None or lb is None:
        return Gain(None, n_pick=n_pick, n_base=n_base, why="a round measured 0 (no ratio)")
    sign = 1.0 if higher else -1.0
    d = sum(lp) / n_pick - sum(lb) / n_base
    point = math.exp(sign * d) - 1.0
    if n_pick < 2 or n_base < 2:
        return Gain(
            point, n_pick=n_pick, n_base=n_base, why="fewer than 2 rounds on a side: no interval"
        )
    if len(set(lp)) == 1 and len(set(lb)) == 1:
        return Gain(
            point, n_pick=n_pick, n_base=n_base, why="no spread between rounds: no interval"
        )
    from scipy import stats

    with warnings.catch_warnings():  # nearly equal values: scipy warns, the interval is still fine
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = stats.ttest_ind(lp, lb, equal_var=False).confidence_interval(confidence)
    lo, hi = sorted((math.exp(sign * float(ci.low)) - 1.0, math.exp(sign * float(ci.high)) - 1.0))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return Gain(point, n_pick=n_pick, n_base=n_base, why="no interval (scipy gave none)")
    return Gain(point, lo, hi, n_pick, n_base)


def gain_of_one(
    value: float,
    base: Sequence[float],
    higher: bool,
    floor: float = 0.0,
    confidence: float = CONFIDENCE,
) -> Gain:
    """The gain of ONE server's ``value`` over ``base`` (the defaults on 2 or more fresh servers)
    and its interval, assuming the pick's server-to-server spread is the defaults': on the log
    values, ``log value − mean(log base) ± t(n−1) · s · √(1 + 1/n)`` (the interval of a new
    observation against the mean of n), with ``s`` the defaults' standard deviation, at least
    ``floor`` (the measurement's own resolution, e.g. the capacity search's bracket). With fewer
    than 2 defaults, no interval."""
    n = len(base)
    if not base:
        return Gain(None, n_pick=1, n_base=0, why="no round measured vLLM's defaults")
    lv, lb = _logs([value]), _logs(base)
    if lv is None or lb is None:
        return Gain(None, n_pick=1, n_base=n, why="a round measured 0 (no ratio)")
    sign = 1.0 if higher else -1.0
    mean = sum(lb) / n
    point = math.exp(sign * (lv[0] - mean)) - 1.0
    if n < 2:
        return Gain(point, n_pick=1, n_base=n, why="the defaults on 1 server: no interval")
    sd = math.sqrt(sum((x - mean) ** 2 for x in lb) / (n - 1))
    sd = max(sd, floor)
    if sd <= 0:
        return Gain(point, n_pick=1, n_base=n, why="no spread between rounds: no interval")
    from scipy import stats

    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd * math.sqrt(1 + 1 / n)
    d = sign * (lv[0] - mean)
    return Gain(point, math.exp(d - half) - 1.0, math.exp(d + half) - 1.0, 1, n)


def gain_in_blocks(
    pick: Sequence[tuple[str | None, float]],
    base: Sequence[tuple[str | None, float]],
    higher: bool,
    floor: float = 0.0,
    confidence: float = CONFIDENCE,
    spread: Sequence[Sequence[tuple[str | None, float]]] = (),
) -> Gain:
    """The gain of ``pick`` over ``base`` when their servers ran on several machines (each value
    with its machine, a block): every pick server is compared with the defaults of its own
    machine, so a machine that reads higher for every config (two H100s read vLLM's defaults
    56-62 and 66-68 req/s, docs/gpu-runs/2026-12-05-levers-chat-h100-2.md) moves neither side.

    The additive model of a randomised block design on the log values, ``log y = arm + machine +
    e``: the point is the mean over the pick's servers of ``log pick - mean(log defaults on its
    machine)``; ``s`` pools the spread within each machine of the defaults and of the pick (at
    least ``floor``), with ``sum(n_m - 1) + sum(k_m - 1)`` degrees of freedom; the interval is
    ``t · s · sqrt(1/k + sum_m (k_m/k)^2 / n_m)`` (``k_m`` pick and ``n_m`` defaults' servers on
    machine ``m``). On one machine with one pick server it is :func:`gain_of_one`. A pick server
    on a machine where no defaults ran is left out (``why`` says so). ``spread``: other arms'
    servers (each arm its values with their machines), whose spread within a machine joins ``s``
    and its degrees of freedom and nothing else: the model's one ``e`` for every config (the
    confirm stage's other picks, for :func:`tuner.confirm_stop.settled_below`)."""
    n_all = len(base)
    by_m = _by_machine(base)
    used = [(m, v) for m, v in pick if m in by_m]
    left = len(pick) - len(used)
    note = (
        f"{left} server{'s' if left != 1 else ''} on a machine without the defaults left out"
        if left
        else None
    )
    if not used:
        why = note if pick else "no round measured the pick"
        return Gain(None, n_pick=0, n_base=n_all, why=why)
    lb = {m: _logs(vs) for m, vs in by_m.items()}
    lp = _logs([v for _, v in used])
    if lp is None or any(x is None for x in lb.values()):
        return Gain(None, n_pick=len(used), n_base=n_all, why="a round measured 0 (no ratio)")
    logs_b = {m: x for m, x in lb.items() if x is not None}
    mean_b = {m: sum(x) / len(x) for m, x in logs_b.items()}
    k = len(used)
    sign = 1.0 if higher else -1.0
    d = sum(x - mean_b[m] for (m, _), x in zip(used, lp, strict=True)) / k
    point = math.exp(sign * d) - 1.0
    n_base = sum(len(logs_b[m]) for m in {m for m, _ in used})
    by_pick = _by_machine([(m, x) for (m, _), x in zip(used, lp, strict=True)])
    others = [g for arm in spread for g in _by_machine(arm).values()]
    spread_logs = [
        xs for g in others if (xs := [math.log(v) for v in g if v > 0 and math.isfinite(v)])
    ]
    groups = [*logs_b.values(), *by_pick.values(), *spread_logs]
    ss = sum(sum((x - sum(g) / len(g)) ** 2 for x in g) for g in groups)
    df = sum(len(g) - 1 for g in groups)
    if df < 1:
        why = "no machine ran 2 servers of one arm: no spread within a machine, no interval"
        return Gain(point, n_pick=k, n_base=n_base, why=why)
    sd = max(math.sqrt(ss / df), floor)
    if sd <= 0:
        return Gain(point, n_pick=k, n_base=n_base, why="no spread between rounds: no interval")
    from scipy import stats

    share = sum((len(xs) / k) ** 2 / len(logs_b[m]) for m, xs in by_pick.items())
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * sd * math.sqrt(1 / k + share)
    lo, hi = sorted((math.exp(sign * d - half) - 1.0, math.exp(sign * d + half) - 1.0))
    return Gain(point, lo, hi, k, n_base, why=note)


def _by_machine(values: Sequence[tuple[str | None, float]]) -> dict[str | None, list[float]]:
    """The values grouped by the machine each came from, in order."""
    out: dict[str | None, list[float]] = {}
    for m, v in values:
        out.setdefault(m, []).append(v)
    return out


def gain_by_machine(
    pick: Sequence[tuple[str | None, float]],
    base: Sequence[tuple[str | None, float]],
    higher: bool,
) -> Gain:
    """:func:`gain` where every value came from one machine; where they came from several (a
    confirm stage continued on another GPU machine), :func:`gain_in_blocks`: each pick round
    against the defaults' rounds on its own machine."""
    if len({m for m, _ in [*pick, *base]}) > 1:
        return gain_in_blocks(pick, base, higher)
    return gain([v for _, v in pick], [v for _, v in base], higher)


@dataclass(frozen=True)
class Arm:
    """One confirm candidate as the rule sees it."""

    trial: int
    values: tuple[float | None, ...]
    """The metric per round (the worst over that round's runs); None for a round without one."""
    held: bool
    """No run failed or broke a constraint, in any round."""
    baseline: bool = False
    machines: tuple[str | None, ...] = ()
    """The machine of each round's server (:func:`tuner.stored_trial.machine`); empty or None:
    not recorded (one machine)."""

    @property
    def measured(self) -> list[float]:
        return [v for v in self.values if v is not None]

    @property
    def measured_on(self) -> list[tuple[str | None, float]]:
        """The measured rounds, each with its machine."""
        machines = self.machines or (None,) * len(self.values)
        return [(m, v) for m, v in zip(machines, self.values, strict=True) if v is not None]


@dataclass(frozen=True)
class Verdict:
    """What the confirm stage concludes, and what it recommends."""

    kind: str
    """One of :data:`VERDICTS`."""
    metric: str
    higher: bool
    recommended: int | None
    """The recommended trial: the pick with the best claimed gain, vLLM's defaults (``no_gain``),
    or for ``undetermined`` the best held pick not measured below the defaults."""
    shown: int | None
    """The pick whose gain :func:`line` shows: the recommended pick, else the best held one."""
    baseline: int | None
    rounds: int
    min_effect: float
    gains: dict[int, Gain] = field(default_factory=dict)
    """Each pick's gain over the defaults, by trial (the defaults' own trial has none)."""
    note: str | None = None
    """What else the reader must know: the defaults demoted under stress, why no interval."""
    quality: str | None = None
    """What the confirm stage's quality guard found (:func:`tuner.quality_guard.note`): shown
    with every kind of verdict; None when no candidate changes numerics."""

    @property
    def gain(self) -> Gain | None:
        return None if self.shown is None else self.gains.get(self.shown)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["gains"] = {str(k): asdict(g) for k, g in self.gains.items()}
        return out

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Verdict:
        gains = {int(k): Gain(**g) for k, g in (data.get("gains") or {}).items()}
        return Verdict(**{**data, "gains": gains})


def _typical(a: Arm) -> float | None:
    """The geometric mean of the arm's round values (what the gain compares); None without."""
    logs = _logs(a.measured)
    if not a.measured:
        return None
    if logs is None:
        return min(a.measured)
    return math.exp(sum(logs) / len(logs))


def decide(
    arms: Sequence[Arm], metric: str, higher: bool, min_effect: float, rounds: int
) -> Verdict:
    """The verdict rule of the module docstring. ``arms``: the candidates in ``confirm.picks``
    order (the order breaks ties); the one with ``baseline`` set is vLLM's defaults."""
    base = next((a for a in arms if a.baseline), None)
    picks = [a for a in arms if not a.baseline]
    gains = (
        {}
        if base is None
        else {a.trial: gain_by_machine(a.measured_on, base.measured_on, higher) for a in picks}
    )
    sign = 1.0 if higher else -1.0

    def rank(a: Arm) -> tuple[int, float]:
        t = _typical(a)
        return (0, -sign * t) if t is not None else (1, 0.0)

    held = sorted((a for a in picks if a.held), key=rank)  # stable: picks order breaks ties
    claimed = [a for a in held if a.trial in gains and gains[a.trial].claimed(min_effect)]
    notes = []
    if base is None:
        notes.append("vLLM's defaults were not confirmed (no baseline pick)")
    elif not base.held:
        notes.append("vLLM's defaults were demoted under stress")
    if base is not None and len(base.measured) < 2:
        notes.append(f"vLLM's defaults measured in {len(base.measured)} round(s)")

    def verdict(kind: str, recommended: int | None, shown: int | None) -> Verdict:
        g = gains.get(shown) if shown is not None else None
        why = [*notes, *([g.why] if g is not None and g.why and kind != "gain" else [])]
        return Verdict(
            kind,
            metric,
            higher,
            recommended,
            shown,
            None if base is None else base.trial,
            rounds,
            min_effect,
            gains,
            "; ".join(dict.fromkeys(why)) or None,
        )

    if claimed:
        return verdict("gain", claimed[0].trial, claimed[0].trial)
    best = held[0].trial if held else None
    if base is not None and base.held and len(base.measured) >= 2:
        return verdict("no_gain", base.trial, best)
    fine = [a for a in held if not (a.trial in gains and gains[a.trial].below)]
    if fine:
        return verdict("undetermined", fine[0].trial, fine[0].trial)
    keep = base.trial if base is not None and base.held else None
    return verdict("undetermined", keep, best)


def pct(x: float) -> str:
    """A fraction as a signed percentage with a true minus sign: ``+8.1``, ``−1.5``."""
    s = f"{x * 100:+.1f}"
    return s.replace("-", "\u2212")


def _interval(g: Gain) -> str:
    if g.low is None or g.high is None:
        return ""
    return f"{CONFIDENCE * 100:.0f} % CI {pct(g.low)} … {pct(g.high)} %"


def gain_text(g: Gain | None, metric: str = "") -> str:
    """``+8.1 % goodput (95 % CI +4.2 … +12.3 %)`` for a :class:`Gain`."""
    if g is None or g.value is None:
        return ""
    ci = _interval(g)
    return f"{pct(g.value)} %{' ' + metric if metric else ''}{f' ({ci})' if ci else ''}"


def _rounds(g: Gain) -> str:
    if g.n_pick == g.n_base:
        return f"{g.n_pick} round{'s' if g.n_pick != 1 else ''} each"
    return f"{g.n_pick} and {g.n_base} rounds"


def line(v: Verdict) -> str:
    """The verdict in one line, e.g. ``Verdict: +8.1 % capacity_rps (95 % CI +4.2 … +12.3 %, 3
    rounds each) → gain: trial 6``."""
    return _line(v) + (f" [{v.quality}]" if v.quality else "")


def _line(v: Verdict) -> str:
    g = v.gain
    measured = ""
    if g is not None and g.value is not None:
        parts = [_interval(g), _rounds(g)]
        measured = f"{pct(g.value)} % {v.metric} ({', '.join(p for p in parts if p)})"
    if v.kind == "gain":
        return f"Verdict: {measured} → gain: trial {v.recommended}"
    note = f" [{v.note}]" if v.note else ""
    if v.kind == "no_gain":
        if not v.gains:
            head = "every pick is vLLM's defaults, nothing to compare"
        elif v.shown is None:
            head = "no pick held in every round"
        elif g is not None and g.value is not None and g.low is not None and g.low > 0:
            head = f"gain under confirm.min_effect {v.min_effect:.0%}: {measured}"
        else:
            head = f"no significant gain: {measured}" if measured else "no significant gain"
        return f"Verdict: {head} — keep vLLM's defaults (trial {v.recommended}){note}"
    what = f"{measured}, " if measured else ""
    if v.recommended is None:
        return f"Verdict: undetermined ({what}no pick held) — nothing recommended{note}"
    if v.recommended == v.baseline:
        return f"Verdict: undetermined ({what}no pick better) — keep vLLM's defaults{note}"
    return (
        f"Verdict: undetermined ({what}not proven better than vLLM's defaults) → "
        f"trial {v.recommended}{note}"
    )
