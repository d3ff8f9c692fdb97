"""A capacity search's answer from its steps: each replay (:class:`Step`), the answer
(:class:`Capacity`), read from the bracket's two ends (:func:`answer`) or again from a finished
search's recorded steps (:func:`from_steps`), and how the tables show it. The search itself is
:mod:`tuner.capacity`'s.

The result is in requests/s (the offered rate of open-loop workloads and traces, the served
request throughput of a closed loop): ``low`` is the rate of the highest load that held,
``high`` the rate of the load above it that failed, and ``rps`` lies on the line between them at
the estimated crossing. A closed loop's served rate saturates as its concurrency grows, so the
failed step's own rate is used, not the held one's scaled in proportion to the load (that read
2–3 % high in three simulator trials and moved with where the bracket ended). A failed step
that was pruned has no full rate: there the least bound on it stands in (:func:`_stand_in`:
the held step's rate scaled to its load, the line through the held step and the full one below
it, a rate served in full at a higher load).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.config import CapacityConfig
from tuner.score import CAPACITY_METRICS, PER_GPU

__all__ = ["Capacity", "Step", "answer", "from_steps", "rps_text", "shown", "unsettled"]


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
        factor, rps, margin = (float(row[k]) for k in ("factor", "rps", "margin"))
        return cls(factor, rps, margin, bool(row["held"]), metrics, row.get("pruned"))

    def row(self) -> dict[str, Any]:
        head = {"factor": self.factor, "rps": self.rps, "margin": self.margin, "held": self.held}
        return {**head, "pruned": self.pruned, **dict(self.metrics)}


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
    capped: bool = False
    """Censored above: the incumbent probe lost and the search stopped; capacity is below
    ``high`` (the load that failed) and ``rps`` is an estimate under it."""

    @property
    def factor_high(self) -> float:
        """The lowest load factor above ``factor`` that failed (the bracket's top; for a capacity
        censored above, the incumbent's load where this server lost), or ``factor`` where none
        did."""
        failed = [s.factor for s in self.steps if not s.held and s.factor >= self.factor]
        return min(failed, default=self.factor)

    @property
    def bound(self) -> float:
        """``capacity_censored``: 1 at least ``rps`` (held everywhere tried), −1 below
        ``high`` (the incumbent probe lost), 0 bracketed."""
        return 1.0 if self.censored else -1.0 if self.capped else 0.0

    def metrics(self, gpus: int | None = None) -> dict[str, float]:
        """:data:`CAPACITY_METRICS`; ``capacity_per_gpu_rps`` (``rps`` / ``gpus``, censored as
        ``rps`` is) only where ``gpus``, the server's GPUs (TP × DP), is given."""
        values = (
            self.rps, self.low, self.high, self.factor, self.factor_high, len(self.steps),
            self.bound,
        )  # fmt: skip
        out = {k: float(v) for k, v in zip(CAPACITY_METRICS, values, strict=False)}
        if gpus is not None:
            out[PER_GPU] = self.rps / max(1, gpus)
        return out


def unsettled(cap: Capacity, settings: CapacityConfig) -> float | None:
    """How wide the bracket was left, ``high / low − 1``, where the search ran out of replays
    (``max_steps``) with it wider than ``rel_width``; None where it closed, held everywhere or was
    capped. An image_heavy server on an H100 spent 4 of its 5 replays walking down from a
    prediction that lost and ended 32 % wide (6.85–9.06 req/s), against the 5 % asked
    (docs/gpu-runs/2026-12-07-image-heavy-screen-h100.md).

    >>> s = CapacityConfig(rel_width=0.05, max_steps=2)
    >>> wide = Capacity(8.4, 6.85, 9.06, 2.5, (Step(1.0, 6.85, 0.6, True),) * 2)
    >>> round(unsettled(wide, s), 3), unsettled(wide, CapacityConfig(rel_width=0.05))
    (0.323, None)
    """
    if cap.censored or cap.capped or cap.low <= 0 or len(cap.steps) < settings.max_steps:
        return None
    width = cap.high / cap.low - 1.0
    return width if width > settings.rel_width else None


def rps_text(rps: float) -> str:
    """A rate in req/s with at least three significant figures: ``69.7``, ``1.12``, ``0.966``
    (long_docs serves about 1 req/s, where one decimal showed 1.119 and 1.154 as 1.1 and 1.2)."""
    return f"{rps:,.1f}" if abs(rps) >= 10 else f"{rps:.2f}" if abs(rps) >= 1 else f"{rps:.3f}"


def shown(rps: float, censored: float | None, high: float | None = None) -> str:
    """A capacity as the tables show it (:func:`rps_text`): ``>= 69.7`` censored below (held
    everywhere tried); censored above (the incumbent probe lost), ``< 58.2 (~20.5)``: the bound
    ``high`` that was established, then the estimate the sampler is told (``< 20.5`` without
    ``high``)."""
    if censored is not None and censored > 0:
        return f">= {rps_text(rps)}"
    if censored is not None and censored < 0:
        est = rps_text(rps)
        return f"< {rps_text(high)} (~{est})" if high is not None else f"< {est}"
    return rps_text(rps)


def from_steps(steps: Sequence[Step]) -> Capacity:
    """The answer again from a finished search's steps (e.g. ``capacity.json`` rows read back
    with :meth:`Step.from_row`): the highest load that held below the lowest one above it that
    failed, and that one, as :func:`tuner.capacity.search` ends. For reading old runs with this
    estimator."""
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
    return answer(lo, hi, steps)


def _interpolate(lo: Step, hi: Step) -> float:
    """The factor where the margin crosses zero on the line through the bracket's two steps."""
    if lo.margin > 0 > hi.margin:
        t = lo.margin / (lo.margin - hi.margin)
        return lo.factor + t * (hi.factor - lo.factor)
    return lo.factor


def _stand_in(lo: Step, hi: Step, steps: Sequence[Step]) -> float:
    """The rate a failed step ``hi`` that was pruned (it has no full rate of its own) stands in
    for, above the held ``lo``. The served rate grows with the load, and ever more slowly (a
    closed loop saturates; an open loop's offered rate is its load's exactly), so three lines
    bound it from above at ``hi``'s load: ``lo``'s rate scaled to it (the line through zero),
    the line through ``lo`` and the highest step below it measured in full (tighter where the
    rate has begun to saturate), and any rate measured in full at a load at or above ``hi``'s.
    The least of them stands in. Scaling alone read an image_heavy server on an H100 at
    17.05 req/s, from its own replay at 1x (6.85) to a pruned step at 3.06x, where a full step
    at 3.31x had served 9.06 and no replay of its config measured in full served more than 9.6
    (docs/gpu-runs/2026-12-07-image-heavy-screen-h100.md)."""
    full = [s for s in steps if s.pruned is None]
    top = lo.rps / lo.factor * hi.factor
    below = [s for s in full if s.factor < lo.factor]
    if below:
        b = max(below, key=lambda s: s.factor)
        slope = max(0.0, (lo.rps - b.rps) / (lo.factor - b.factor))
        top = min(top, lo.rps + slope * (hi.factor - lo.factor))
    return min([top, *(s.rps for s in full if s.factor >= hi.factor)])


def answer(
    lo: Step | None, hi: Step | None, steps: Sequence[Step], ceiling: float | None = None
) -> Capacity:
    if lo is None:  # nothing held down to min_factor: no capacity at these SLOs
        top = hi.rps if hi is not None else 0.0
        return Capacity(0.0, 0.0, top, 0.0, tuple(steps))
    if hi is None:  # held everywhere tried: at least this much
        return Capacity(lo.rps, lo.rps, lo.rps, lo.factor, tuple(steps), censored=True)
    # requests/s on the line between the two steps' own rates, at the crossing: a closed loop's
    # served rate grows more slowly than its concurrency (it saturates), so scaling the held
    # step's rate in proportion to the load overstates it. A failed step stopped early (pruned)
    # has no full rate of its own: :func:`_stand_in`'s bound on it stands in. Never
    # below the rate that held: that one was served within the SLOs; never above ``ceiling``
    # (an incumbent's rate where this server lost) when given.
    if hi.factor <= lo.factor:  # one load held and failed (a noisy server): the capacity is there
        return Capacity(lo.rps, lo.rps, max(hi.rps, lo.rps), lo.factor, tuple(steps))
    f = _interpolate(lo, hi)
    top = hi.rps if hi.pruned is None else _stand_in(lo, hi, steps)
    top = max(top, lo.rps)
    if ceiling is not None:
        top = max(min(top, ceiling), lo.rps)
    t = (f - lo.factor) / (hi.factor - lo.factor)
    return Capacity(lo.rps + t * (top - lo.rps), lo.rps, top, f, tuple(steps))
