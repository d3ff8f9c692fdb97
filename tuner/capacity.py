"""SLO capacity: the highest load at which the workload's SLOs hold, found on one server.

A start-up costs 60–140 s on the H200 and a short replay 15–30 s, so several replays on the
server a trial already started are cheap. :func:`search` brackets the load and narrows it:

1. start at the workload's own load (factor 1; its replay is the first step),
2. double the load while the SLOs hold, halve it while they do not, until one load holds and the
   next one up does not (or ``max_factor`` / ``min_factor`` is reached),
3. between the two, try the load where the SLO margin's straight line crosses zero (clamped
   away from the ends, as ``vllm bench sweep``'s SLA mode interpolates; plain bisection when the
   margins give no crossing), until the bracket is within ``rel_width`` or ``max_steps`` replays
   have run.

The load is a factor on the workload's load: its request rate (open loop), its concurrency
(closed loop, rounded up) or a trace's speed (``time_scale`` divided by the factor). A step
*holds* when every SLO at ``objective.slo_percentile`` is met and the error rate is within
``objective.max_error_rate``. Its *margin* is the smallest relative headroom (``1 − value /
limit`` over the SLOs, ``1 − error rate / budget``; :func:`tuner.capacity_probe.margin`): ≥ 0
holds, < 0 does not. If margins are not monotone in the load (noise near the bound), the bracket
still ends at a load that held below one that did not: the first crossing found, a conservative
answer.

The result is in requests/s (the offered rate of open-loop workloads and traces, the served
request throughput of a closed loop): ``low`` is the rate of the highest load that held,
``high`` the rate of the load above it that failed, and ``rps`` lies on the line between them at
the estimated crossing. A closed loop's served rate saturates as its concurrency grows, so the
failed step's own rate is used, not the held one's scaled in proportion to the load (that read
2–3 % high in three simulator trials and moved with where the bracket ended). A failed step
that was pruned has no full rate: there the held step's rate scaled to its load stands in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.config import CapacityConfig

__all__ = [
    "CAPACITY_METRICS",
    "Capacity",
    "Step",
    "from_steps",
    "search",
]


@dataclass(frozen=True)
class Step:
    """One replay of the search: its load factor, requests/s, margin and whether it held."""

    factor: float
    rps: float
    margin: float
    held: bool
    metrics: Mapping[str, float] = field(default_factory=dict)
    pruned: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Step:
        """A step back from its :meth:`row` (``capacity.json``'s ``steps``)."""
        known = {"factor", "rps", "margin", "held", "pruned"}
        metrics = {k: float(v) for k, v in row.items() if k not in known and v is not None}
        return cls(
            float(row["factor"]),
            float(row["rps"]),
            float(row["margin"]),
            bool(row["held"]),
            metrics,
            row.get("pruned"),
        )

    def row(self) -> dict[str, Any]:
        return {
            "factor": self.factor,
            "rps": self.rps,
            "margin": self.margin,
            "held": self.held,
            "pruned": self.pruned,
            **dict(self.metrics),
        }


@dataclass(frozen=True)
class Capacity:
    """The search's answer: ``low`` ≤ ``rps`` ≤ ``high`` requests/s, with every step."""

    rps: float
    low: float
    high: float
    factor: float
    steps: tuple[Step, ...]
    censored: bool = False
    """Held at every load tried (up to ``max_factor`` or ``max_steps``): capacity is at least
    ``rps``."""

    def metrics(self) -> dict[str, float]:
        values = (self.rps, self.low, self.high, self.factor, len(self.steps), self.censored)
        return {k: float(v) for k, v in zip(CAPACITY_METRICS, values, strict=True)}


CAPACITY_METRICS = (
    "capacity_rps",
    "capacity_rps_low",
    "capacity_rps_high",
    "capacity_factor",
    "capacity_steps",
    "capacity_censored",
)
"""What :meth:`Capacity.metrics` records on a trial."""


Probe = Callable[[float], Awaitable[Step]]
"""Replays the workload at a load factor on the trial's server and judges it."""


async def search(
    probe: Probe,
    settings: CapacityConfig,
    first: Step | None = None,
    loads: Callable[[float], float] | None = None,
) -> Capacity:
    """Bracket and narrow the load at which the SLOs stop holding (module docstring).
    ``first``: the workload's own replay at factor 1, if it ran already. ``loads``: the factor a
    replay asked for at ``f`` really runs at (a closed loop's concurrency is whole); the search
    ends when no load is left strictly inside the bracket."""
    real = loads or (lambda f: f)
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
    # 1. bracket: double while it holds, halve while it does not
    while len(steps) < settings.max_steps:
        if lo is not None and hi is None:
            f = lo.factor * 2
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
        if s.held:
            lo = s
        else:
            hi = s
    # 2. narrow: the margin line's zero, kept inside the bracket's middle 60 % (so a curved
    # margin cannot hold one end still while the other creeps)
    while lo is not None and hi is not None and len(steps) < settings.max_steps:
        if (hi.factor - lo.factor) / lo.factor <= settings.rel_width:
            break
        f = _next_factor(lo, hi)
        if not lo.factor < real(f) < hi.factor:
            f = lo.factor * (1 + 1e-9)  # the next load up from the one that held, if any
            if not lo.factor < real(f) < hi.factor:
                break  # no load left between the two
        s = await at(f)
        if s.held:
            lo = s
        else:
            hi = s
    return _answer(lo, hi, steps)


def from_steps(steps: Sequence[Step]) -> Capacity:
    """The answer again from a finished search's steps (e.g. ``capacity.json`` rows read back
    with :meth:`Step.from_row`): the highest load that held below the lowest one above it that
    failed, and that one, as :func:`search` ends. For reading old runs with this estimator."""
    held = [s for s in steps if s.held]
    failed = [s for s in steps if not s.held]
    lo: Step | None = None
    hi: Step | None = None
    if held:
        above = [s for s in failed if s.factor > min(h.factor for h in held)]
        ceiling = min((s.factor for s in above), default=float("inf"))
        lo = max((s for s in held if s.factor < ceiling), key=lambda s: s.factor)
        hi = min((s for s in failed if s.factor > lo.factor), key=lambda s: s.factor, default=None)
    elif failed:
        hi = min(failed, key=lambda s: s.factor)
    return _answer(lo, hi, steps)


def _next_factor(lo: Step, hi: Step) -> float:
    a, b = lo.factor, hi.factor
    if lo.margin > 0 > hi.margin:
        t = lo.margin / (lo.margin - hi.margin)
        t = min(0.8, max(0.2, t))
    else:
        t = 0.5
    return a + t * (b - a)


def _interpolate(lo: Step, hi: Step) -> float:
    """The factor where the margin crosses zero on the line through the bracket's two steps."""
    if lo.margin > 0 > hi.margin:
        t = lo.margin / (lo.margin - hi.margin)
        return lo.factor + t * (hi.factor - lo.factor)
    return lo.factor


def _answer(lo: Step | None, hi: Step | None, steps: Sequence[Step]) -> Capacity:
    if lo is None:  # nothing held down to min_factor: no capacity at these SLOs
        top = hi.rps if hi is not None else 0.0
        return Capacity(0.0, 0.0, top, 0.0, tuple(steps))
    if hi is None:  # held everywhere tried: at least this much
        return Capacity(lo.rps, lo.rps, lo.rps, lo.factor, tuple(steps), censored=True)
    # requests/s on the line between the two steps' own rates, at the crossing: a closed loop's
    # served rate grows more slowly than its concurrency (it saturates), so scaling the held
    # step's rate in proportion to the load overstates it. A failed step stopped early (pruned)
    # has no full rate of its own: its load's share of the held step's rate stands in. Never
    # below the rate that held: that one was served within the SLOs.
    f = _interpolate(lo, hi)
    top = hi.rps if hi.pruned is None else lo.rps / lo.factor * hi.factor
    top = max(top, lo.rps)
    t = (f - lo.factor) / (hi.factor - lo.factor)
    return Capacity(lo.rps + t * (top - lo.rps), lo.rps, top, f, tuple(steps))
