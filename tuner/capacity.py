"""SLO capacity: the highest load at which the workload's SLOs hold, found on one server.

A start-up costs 60–140 s on the H200 and a short replay 15–30 s, so several replays on the
server a trial already started are cheap. :func:`search` brackets the load and narrows it:

1. start at the workload's own load (factor 1; its replay is the first step),
2. double the load while the SLOs hold, halve it while they do not, until one load holds and the
   next one up does not (or ``max_factor`` / ``min_factor`` is reached),
3. between the two, try the load where the SLO margin's straight line crosses zero (clamped
   away from the ends, as ``vllm bench sweep``'s SLA mode interpolates; plain bisection when the
   margins give no crossing or the failed end was pruned: a pruned step's margin comes from a
   partial replay, and on the H200 such margins were not monotone in the load, so the line held
   one end still for 4 replays, docs/gpu-runs/2026-12-02-screen-fp8.md), until the bracket is
   within ``rel_width`` or ``max_steps`` replays have run.

**Incumbent probe** (``start``): once the study has a measured capacity, a trial's search
tries the incumbent's load (its capacity factor) right after the workload's own replay. With
``stop_on_loss`` (a search trial) a loss there ends the search: the trial is taken not to beat
the incumbent, and its capacity is stored *censored above* (``capped``: the value is an estimate
below the load that failed, from the bracket's margin line or, without a step that held, the
failed step's margin; ``capacity_censored`` is −1 and the tables show it as "< X"; the estimate
lies between the rate that held and the incumbent's, never at it: a loser must not tie with the
best in the sampler's eyes). For an open loop the load is a rate and that holds. For a closed
loop the load is requests in flight, and a config whose requests finish sooner serves more
requests/s with fewer in flight: its SLOs can fail at the incumbent's count while it beats the
incumbent below it (a quick start's fp8 trial, stopped so, measured 84-90 req/s against the
incumbent's 70.3 on 3 fresh servers). So there (``closed``) the step at the incumbent's load is
pruned only once lost and bound (Little's law) to serve no more requests/s than the incumbent's
capacity, and a loss ends the search only so or where it served no more in full (below that load
it serves less); one that served more walks down by narrow steps, each step below pruned alike,
until one holds (measured) or one loses serving no more than the incumbent (capped: the crossing
lies below that step's rate); one that holds there walks up so too, unless it served more than
``rel_width`` above the incumbent's capacity (no near-tie). Elsewhere a hold climbs from it,
jumping by the margin's extrapolation ``1 / (1 − margin)`` (between ×(1 + 0.9 ``rel_width``)
and :data:`MAX_JUMP`) instead of doubling: wide margins jump further, and a narrow one, near its
own edge, a little. Before the study has a capacity, a ``study.warm_start`` study's best
capacity is the start as a prediction (``Start.binding`` False,
:func:`tuner.storage.search_start`): a loss there narrows the bracket below it instead of ending
the trial. Without ``start`` the search is as above.

The load is a factor on the workload's load: its request rate (open loop), its concurrency
(closed loop, rounded up) or a trace's speed (``time_scale`` divided by the factor). A step
*holds* when every SLO at ``objective.slo_percentile`` is met and the error rate is within
``objective.max_error_rate``. Its *margin* is the smallest relative headroom (``1 − value /
limit`` over the SLOs, ``1 − error rate / budget``; :func:`tuner.capacity_probe.margin`): ≥ 0
holds, < 0 does not. If margins are not monotone in the load (noise near the bound), the bracket
still ends at a load that held below one that did not: the first crossing found, a conservative
answer.

The answer (:class:`Capacity`, in requests/s, and :func:`from_steps` from a finished search's
steps) is :mod:`tuner.capacity_answer`'s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import NamedTuple

from tuner.capacity_answer import (
    Capacity,
    Step,
    answer,
    from_steps,
    rps_text,
    shown,
    unsettled,
)
from tuner.config import CapacityConfig

__all__ = [
    "MAX_JUMP",
    "NARROW_CLIMB",
    "NEAR_STEPS",
    "narrow_climb",
    "start_factor",
    "Capacity",
    "Start",
    "Step",
    "for_gpus",
    "from_steps",
    "search",
    "rps_text",
    "shown",
    "unsettled",
]


class Start(NamedTuple):
    """Where a search goes right after the workload's own replay: an incumbent's capacity (the
    study's best, or a confirm pick's own) as a load ``factor``, and in requests/s (``rps``):
    a trial that loses at that load cannot beat it, so its capacity is capped at ``rps``."""

    factor: float
    rps: float | None = None
    gpus: int | None = None
    """The incumbent's GPUs (TP × DP) where the study ranks capacity per GPU: a server on other
    GPUs probes that capacity per GPU times its own (:func:`for_gpus`); None: not scaled."""
    binding: bool = True
    """False: a prediction (the ``study.warm_start`` study's capacity, before this study has
    one), not an incumbent: a loss there does not end the search and caps nothing."""
    near: bool = False
    """The capacity is expected within the search's resolution of here (a confirm server's
    pick, measured by its own search): from the start the search walks up after a hold, down
    after a loss, first by :func:`narrow_climb` twice, then each step twice the last, at most
    :data:`NEAR_STEPS`, so that a crossing near the start closes the bracket, instead of
    jumping by the margin or narrowing from the workload's own load far below."""

    def prediction(self) -> Start:
        """This start as a prediction: not :attr:`binding`, no rate to cap at."""
        return self._replace(rps=None, binding=False)


def for_gpus(start: Start | None, gpus: int) -> Start | None:
    """``start`` for a server on ``gpus`` GPUs: an incumbent ranked per GPU (``start.gpus`` set)
    scaled by ``gpus / start.gpus`` (to lose at that load is to lose per GPU); else unchanged."""
    if start is None or start.gpus is None or start.gpus == gpus:
        return start
    k = gpus / start.gpus
    return start._replace(
        factor=start.factor * k, rps=None if start.rps is None else start.rps * k, gpus=gpus
    )


MAX_JUMP = 4.0
"""The most a step that held with a wide margin multiplies the load by (incumbent mode)."""

NEAR_STEPS = 4
"""Steps from a ``near`` start before the search brackets as usual: two narrow, then each twice
the last (in log terms), ×1.42 in all. Each twice the last from the first, crossings 4.5-9 % off
the start (4 of 28 confirm servers in 3 quick starts, 2026-12-05; none further) took 1 more."""


Probe = Callable[[float], Awaitable[Step]]
"""Replays the workload at a load factor on the trial's server and judges it."""


async def search(
    probe: Probe,
    settings: CapacityConfig,
    first: Step | None = None,
    loads: Callable[[float], float] | None = None,
    *,
    start: Start | None = None,
    stop_on_loss: bool = False,
    closed: bool = False,
    on_start: Callable[[float], None] = lambda _: None,
) -> Capacity:
    """Bracket and narrow the load at which the SLOs stop holding (module docstring). ``first``: the
    workload's own replay at factor 1, if it ran already. ``loads``: the factor a replay asked for
    at ``f`` really runs at (a closed loop's concurrency is whole); the search ends when no load is
    left strictly inside the bracket. ``start``: the load to try next (the incumbent's capacity;
    ``on_start`` is told it as it is replayed; not where ``first`` decided it, below a loss or above
    a hold); ``stop_on_loss``: a loss at or below it ends the search, censored above and never above
    the incumbent's requests/s (only with a ``start`` that is binding). ``closed``: the load is
    requests in flight (module docstring): a loss there, or at any load below, ends the search only
    where the step served (or was bound to serve) no more requests/s than the incumbent's capacity;
    else the crossing lies below, at a rate that may beat it, and the search walks down by narrow
    steps (as from a ``near`` start); one that holds there walks up so (its margin does not say
    how far: docs/design.md), unless it served more than ``rel_width`` above the incumbent's
    capacity there (:func:`_clear_winner`: it climbs by its margin)."""
    real = loads or (lambda f: f)
    stop_on_loss = stop_on_loss and start is not None and start.binding
    steps: list[Step] = []

    async def at(f: float) -> Step:
        s = await probe(f)
        steps.append(s)
        return s

    s = first if first is not None else await at(1.0)
    if first is not None:
        steps.append(first)
    lo: Step | None = s if s.held else None
    hi: Step | None = None if s.held else s
    ceiling = start.rps if start is not None and start.binding else None
    at_start: Step | None = None
    near = start is not None and start.near
    top = real(start_factor(start, settings)) if stop_on_loss and start else 0.0

    def cannot_beat(s: Step) -> bool:  # lost at or below the incumbent's load, serving no more
        more = closed and _served_more(s, ceiling)
        return stop_on_loss and not s.held and s.factor <= top and not more

    if start is not None and start.factor > 0:
        f = start_factor(start, settings)
        if hi is not None and real(f) >= hi.factor:  # lost below the incumbent's load already
            if stop_on_loss:
                return _capped(lo, hi, steps, ceiling)
        elif not (lo is not None and real(f) <= lo.factor) and len(steps) < settings.max_steps:
            on_start(f)
            s = at_start = await at(f)
            # a closed loop's crossing: near (docs), unless it held serving clearly more than
            # the incumbent there (no near-tie: it climbs by its margin)
            near = near or (stop_on_loss and closed and not _clear_winner(s, ceiling, settings))
            if s.held:
                lo = s if lo is None or s.factor > lo.factor else lo
            else:
                if cannot_beat(s):
                    return _capped(lo, s, steps, ceiling)
                hi = s if hi is None or s.factor < hi.factor else hi
                if lo is not None and lo.factor > s.factor:
                    lo = None
    # 0. from a near start: steps the way it went, two narrow, then each twice the last (×1.045,
    # ×1.045, ×1.09, ×1.19 at a 5 % width), until one crosses; the narrowing finishes the bracket
    if near and at_start is not None:
        up = at_start.held
        for k in range(NEAR_STEPS):
            if len(steps) >= settings.max_steps or _closed(lo, hi, settings.rel_width):
                break
            step = narrow_climb(settings.rel_width) ** (2 ** max(0, k - 1))
            if up:
                assert lo is not None
                f = lo.factor * step
                if f > settings.max_factor or (hi is not None and real(f) >= hi.factor):
                    break
                if real(f) <= lo.factor:  # a closed loop's whole slot: no new load yet
                    continue
            else:
                assert hi is not None
                f = hi.factor / step
                if f < settings.min_factor or (lo is not None and real(f) <= lo.factor):
                    break
                if real(f) >= hi.factor:
                    continue
            s = await at(f)
            if cannot_beat(s):
                return _capped(lo, s, steps, ceiling)
            lo, hi = _took(s, lo, hi)
            if s.held != up:
                break
    # 1. bracket: double while it holds (further on a wide margin from a start), halve while
    # it does not
    while len(steps) < settings.max_steps:
        if lo is not None and hi is None:
            f = lo.factor * (_jump(lo.margin, settings.rel_width) if start is not None else 2)
            if start is not None and f > settings.max_factor >= lo.factor * 2:
                f = settings.max_factor
            if f > settings.max_factor:
                break
            s = await at(f)
        elif hi is not None and lo is None:
            f = hi.factor / 2
            if f < settings.min_factor:
                break
            s = await at(f)
        else:
            break
        if cannot_beat(s):
            return _capped(lo, s, steps, ceiling)
        lo, hi = _took(s, lo, hi)
    # 2. narrow: the margin line's zero, kept inside the bracket's middle 60 % (so a curved
    # margin cannot hold one end still while the other creeps)
    while lo is not None and hi is not None and len(steps) < settings.max_steps:
        if _closed(lo, hi, settings.rel_width):
            break
        f = _next_factor(lo, hi)
        if not lo.factor < real(f) < hi.factor:
            f = lo.factor * (1 + 1e-9)  # the next load up from the one that held, if any
            if not lo.factor < real(f) < hi.factor:
                break  # no load left between the two
        s = await at(f)
        if cannot_beat(s):
            return _capped(lo, s, steps, ceiling)
        lo, hi = _took(s, lo, hi)
    return answer(lo, hi, steps)


def _took(s: Step, lo: Step | None, hi: Step | None) -> tuple[Step | None, Step | None]:
    """The bracket with ``s`` in it: the load that held, or the one that failed."""
    return (s, hi) if s.held else (lo, s)


def start_factor(start: Start, settings: CapacityConfig) -> float:
    """The load factor :func:`search` tries ``start`` at: within ``min_factor``…``max_factor``."""
    return min(max(start.factor, settings.min_factor), settings.max_factor)


def _clear_winner(step: Step, ceiling: float | None, settings: CapacityConfig) -> bool:
    """Whether a closed loop's ``step``, held at the incumbent's load, served more than
    ``rel_width`` above the incumbent's capacity ``ceiling`` there: not a near-tie."""
    if ceiling is None or not step.held or step.pruned is not None:
        return False
    return step.rps > ceiling * (1.0 + settings.rel_width)


def _served_more(step: Step, ceiling: float | None) -> bool:
    """Whether a closed loop's ``step``, lost at the incumbent's load, served more requests/s
    than the incumbent's capacity ``ceiling``. It is pruned there only once bound to serve no
    more; a pruned step's rate (the short requests finished by then) reads high, never counts."""
    return ceiling is not None and step.pruned is None and step.rps > ceiling


NARROW_CLIMB = 0.9
"""A step that held with a narrow margin climbs ×(1 + this × ``rel_width``): a failure there
closes the bracket at once, with room for a closed loop's concurrency rounded up by one slot
(0.2 % at 433 in flight)."""


def _jump(margin: float, rel_width: float) -> float:
    """How far a step that held with ``margin`` climbs: the load where the margin's proportional
    extrapolation reaches zero, ``1 / (1 − margin)``, between ×(1 + :data:`NARROW_CLIMB`
    ``rel_width``) and ×:data:`MAX_JUMP`. A narrow margin climbs just past the bracket's
    resolution: a confirm server that held at its pick's capacity with a margin of 0.03–0.04
    doubled on the H200, and spent 5 replays coming back down
    (docs/gpu-runs/2026-12-03-capacity-study.md); from ×1.1 a failure still left one bisection
    to ``rel_width``, from ×1.045 it leaves none."""
    if margin >= 1.0:
        return MAX_JUMP
    return min(MAX_JUMP, max(narrow_climb(rel_width), 1.0 / (1.0 - margin)))


def narrow_climb(rel_width: float) -> float:
    """The least a step that held climbs by: ×(1 + :data:`NARROW_CLIMB` ``rel_width``)."""
    return 1.0 + NARROW_CLIMB * rel_width


def _capped(
    lo: Step | None, hi: Step, steps: Sequence[Step], ceiling: float | None = None
) -> Capacity:
    """The incumbent probe lost at ``hi``: capacity below its rate, and below ``ceiling`` (the
    incumbent's requests/s: the trial lost where the incumbent held, so it cannot beat it; a
    failed step's own served rate, e.g. a closed loop past its SLOs, can be far above it). The
    estimate: on the margin line between a step that held and ``hi`` (as :func:`answer`, with
    ``ceiling`` as the most ``hi`` could serve: a closed loop's failed load, or the held rate
    scaled to it, can read far above the incumbent's rate where this server lost), else
    ``hi``'s margin extrapolated down (``1 − margin`` as the overshoot), at most ×4 below."""
    if lo is not None and lo.factor < hi.factor:
        a = replace(answer(lo, hi, steps, ceiling), capped=True)
    else:
        over = 1.0 - min(hi.margin, 0.0)  # > 1: how far past the SLOs the failed load was
        share = max(1.0 / over, 0.25)
        a = Capacity(hi.rps * share, 0.0, hi.rps, hi.factor * share, tuple(steps), capped=True)
    if ceiling is None or a.high <= ceiling:
        return a
    top = max(ceiling, a.low)
    return replace(a, rps=min(a.rps, top), high=top)


def _closed(lo: Step | None, hi: Step | None, rel_width: float) -> bool:
    """Whether the bracket is narrow enough: a load held and the next one up failed within
    ``rel_width`` of it, or their requests/s are (the failed one's own rate, as :func:`answer`
    reads it; a pruned one has none). The answer lies between the two rates, so that is the
    capacity within ``rel_width``. A saturated closed loop serves about the same rate over a
    wide range of requests in flight, and where its SLOs break in that range moves from server
    to server: in the quick start under ``objective=capacity`` (2026-12-04, speed-up 8) one
    pick's fresh servers broke at 441-506 in flight, all at 69.3-70.6 req/s, and narrowing the
    load to 5 % took up to 7 replays that moved the answer by less than 2 %."""
    if lo is None or hi is None:
        return False
    if (hi.factor - lo.factor) / lo.factor <= rel_width:
        return True
    return hi.pruned is None and (max(hi.rps, lo.rps) - lo.rps) / lo.rps <= rel_width


def _next_factor(lo: Step, hi: Step) -> float:
    a, b = lo.factor, hi.factor
    if lo.margin > 0 > hi.margin and hi.pruned is None:
        t = lo.margin / (lo.margin - hi.margin)
        t = min(0.8, max(0.2, t))
    else:
        t = 0.5
    return a + t * (b - a)
