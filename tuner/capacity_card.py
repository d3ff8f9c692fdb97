"""The capacity card: capacity per SLO tier, servers for a target load, cost per million tokens.

A trial's SLO capacity (:mod:`tuner.capacity`) answers "how much load can one server take at the
workload's SLOs". The card turns it into what an operator decides, from measurements only:

* **capacity per SLO tier**, without new replays: every capacity step stored its percentiles
  (``capacity.json``), so each step is judged again against the SLO limits × a scale
  (``plan.slo_scales``, default ×0.5, ×1, ×2: stricter, the workload's, looser) with the one rule
  of an SLO (:func:`tuner.score.slo_margins`; the error budget unchanged) and the capacity found
  again between the held and failed steps (:func:`tuner.capacity.from_steps`). Where no step held
  at a tier, its capacity is below the lowest load measured; where every step held, at least the
  highest: both are marked *outside the measured loads* (``outside``: ``below`` / ``above``). A
  step that was pruned (stopped early, partial percentiles) cannot be judged held at a looser
  tier: there it is left out.
* **an interval**: over rounds (the confirm stage's fresh servers, or several servers' searches)
  the geometric mean and its 95 % t-interval on the log values (as :mod:`tuner.verdict`); one
  search alone gives its bracket (the held load below, the failed one above).
* **a plan** for ``plan.target_rps`` requests/s: servers ``ceil(target / capacity)`` (the range
  from the interval's ends), GPUs = servers × TP × DP (``tuner.engine.pool.gpus_per_server``); with
  ``plan.gpu_hour_usd``, the cost per 1M output tokens and per 1M requests served at capacity,
  and each pick's saving against vLLM's defaults.

:func:`tier_capacity`, :func:`estimate` and :func:`make_card` are pure (numbers in, card out);
:func:`tuner.study_card.study_card` assembles a study's card from its confirm record and trial
folders.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tuner.capacity import Step, from_steps
from tuner.config import ObjectiveConfig, SLOConfig
from tuner.score import slo_margins
from tuner.verdict import CONFIDENCE

__all__ = [
    "AT_MOST",
    "Card",
    "Entry",
    "Estimate",
    "Plan",
    "TierCapacity",
    "estimate",
    "make_card",
    "scaled",
    "tier_capacity",
    "tiers_of",
]


OUTSIDE = "outside the measured loads"
AT_MOST = "at most the workload's tier, which fresh servers measured"


def scaled(slo: SLOConfig, scale: float) -> SLOConfig:
    """The SLO limits × ``scale`` (< 1 stricter, > 1 looser); limits not set stay unset."""
    return replace(
        slo,
        **{k: (None if v is None else v * scale) for k, v in asdict(slo).items()},
    )


def limits(slo: SLOConfig) -> dict[str, float]:
    return {k: float(v) for k, v in asdict(slo).items() if v is not None}


def _rejudge(step: Step, objective: ObjectiveConfig, slo: SLOConfig) -> Step | None:
    """The step judged at ``slo``: its margin again from its percentiles and error rate; None for
    a pruned step that would hold (its percentiles are partial: not a measurement of holding)."""
    m = step.metrics
    room = [-1.0 if r is None else r for r in slo_margins(m, objective, slo).values()]
    err = float(m.get("error_rate", 0.0))
    budget = objective.max_error_rate
    room.append(1.0 - err / budget if budget > 0 else (0.0 if err <= 0 else -1.0))
    margin = min(room)
    if step.pruned is not None and margin >= 0:
        return None
    return replace(step, margin=margin, held=margin >= 0)


@dataclass(frozen=True)
class TierCapacity:
    """One server's capacity at the SLO limits × ``scale``: ``low`` ≤ ``rps`` ≤ ``high``."""

    scale: float
    rps: float
    low: float
    high: float
    outside: str | None = None
    """``below``: no measured load held (capacity under ``high``, the lowest load tried);
    ``above``: every measured load held (capacity at least ``rps``); None: inside."""


def tier_capacity(
    steps: Sequence[Step], objective: ObjectiveConfig, slo: SLOConfig, scale: float
) -> TierCapacity:
    """The capacity of one search's ``steps`` at the SLO limits × ``scale`` (module docstring)."""
    judged = [s for s in (_rejudge(s, objective, scaled(slo, scale)) for s in steps) if s]
    if not judged:
        return TierCapacity(scale, 0.0, 0.0, 0.0, "below")
    cap = from_steps(judged)
    if cap.censored:
        top = max(s.rps for s in judged)
        return TierCapacity(scale, top, top, top, "above")
    if cap.rps <= 0:
        return TierCapacity(scale, 0.0, 0.0, min(s.rps for s in judged), "below")
    return TierCapacity(scale, cap.rps, cap.low, cap.high)


def tiers_of(
    steps: Sequence[Step], objective: ObjectiveConfig, slo: SLOConfig, scales: Sequence[float]
) -> dict[float, TierCapacity]:
    """:func:`tier_capacity` at each scale, never lower at a looser tier than at a stricter one:
    a load that held at stricter limits holds at looser ones, but a closed loop's served rate is
    not monotone in its load, so the crossing found between other steps can read lower."""
    out: dict[float, TierCapacity] = {}
    floor: TierCapacity | None = None
    for s in sorted(scales):
        t = tier_capacity(steps, objective, slo, s)
        if floor is not None and floor.outside is None and t.outside is None and t.rps < floor.rps:
            t = replace(t, rps=floor.rps, low=max(t.low, floor.low), high=max(t.high, floor.rps))
        out[s] = t
        floor = t if t.outside is None else floor
    return out


@dataclass(frozen=True)
class Estimate:
    """A capacity over ``n`` servers: the geometric mean and its 95 % interval (one server: its
    bracket); ``outside`` as :class:`TierCapacity`'s when any server's was, or ``at_most``: a
    stricter tier bounded by the workload's, which fresh servers measured (the capacity is at
    most ``rps``; ``low`` is what its search held, :func:`tuner.study_card.entry`)."""

    rps: float
    low: float
    high: float
    n: int
    outside: str | None = None


def estimate(values: Sequence[TierCapacity], confidence: float = CONFIDENCE) -> Estimate | None:
    """Several servers' capacities at one tier as one :class:`Estimate` (None without any)."""
    if not values:
        return None
    outside = next((v.outside for v in values if v.outside), None)
    if len(values) == 1 or any(v.rps <= 0 for v in values):
        v = min(values, key=lambda v: v.rps)
        lows = min(v.low for v in values)
        highs = max(v.high for v in values) if len(values) > 1 else v.high
        return Estimate(v.rps, lows, highs, len(values), outside)
    logs = [math.log(v.rps) for v in values]
    n = len(logs)
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    from scipy import stats

    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return Estimate(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, outside)


@dataclass(frozen=True)
class Entry:
    """One config on the card: a confirmed pick or vLLM's defaults."""

    trial: int
    label: str
    baseline: bool
    gpus_per_server: int
    tiers: Mapping[float, Estimate]
    """Capacity (requests/s) per SLO scale; 1.0 is the workload's own SLO."""
    output_tokens_per_request: float | None = None


@dataclass(frozen=True)
class Plan:
    """An entry's servers for the target and its cost at capacity (the workload's SLO)."""

    servers: int | None = None
    servers_low: int | None = None
    """From the interval's high end (fewest servers)."""
    servers_high: int | None = None
    """From the interval's low end (most servers)."""
    gpus: int | None = None
    gpus_low: int | None = None
    gpus_high: int | None = None
    usd_per_m_output_tokens: float | None = None
    usd_per_m_requests: float | None = None
    saving: float | None = None
    """1 − this cost / the defaults' cost, per request at capacity (> 0: cheaper)."""
    gpus_saved: int | None = None


@dataclass(frozen=True)
class Card:
    metric_slo: dict[str, float]
    """The workload's SLO limits (ms) at scale 1, and the percentile they apply to."""
    scales: tuple[float, ...]
    target_rps: float | None
    gpu_hour_usd: float | None
    entries: tuple[Entry, ...]
    plans: dict[int, Plan] = field(default_factory=dict)
    target_source: str | None = None
    """``plan.target_rps``, or the trace's peak rate it was taken from."""

    def as_dict(self) -> dict[str, Any]:
        """``capacity_card.json``: plain JSON (tier keys as strings)."""
        return {
            "slo": self.metric_slo,
            "scales": list(self.scales),
            "target_rps": self.target_rps,
            "target_source": self.target_source,
            "gpu_hour_usd": self.gpu_hour_usd,
            "outside_note": OUTSIDE,
            "at_most_note": AT_MOST,
            "entries": [
                {
                    "trial": e.trial,
                    "label": e.label,
                    "baseline": e.baseline,
                    "gpus_per_server": e.gpus_per_server,
                    "output_tokens_per_request": e.output_tokens_per_request,
                    "tiers": {f"{s:g}": asdict(est) for s, est in e.tiers.items()},
                    "plan": asdict(self.plans.get(e.trial, Plan())),
                }
                for e in self.entries
            ],
        }

    def metrics(self) -> dict[str, float]:
        """MLflow metrics: ``card_<trial>_capacity_x<scale>``, ``card_<trial>_servers``,
        ``card_<trial>_usd_per_m_output_tokens``, ``card_<trial>_saving`` where known."""
        out: dict[str, float] = {}
        for e in self.entries:
            key = f"card_{e.trial}"
            for s, est in e.tiers.items():
                out[f"{key}_capacity_x{s:g}"] = est.rps
            p = self.plans.get(e.trial, Plan())
            for name in ("servers", "gpus", "usd_per_m_output_tokens", "usd_per_m_requests"):
                v = getattr(p, name)
                if v is not None:
                    out[f"{key}_{name}"] = float(v)
            if p.saving is not None:
                out[f"{key}_saving"] = p.saving
        return out


def _servers(target: float, capacity: float) -> int | None:
    return math.ceil(target / capacity - 1e-9) if capacity > 0 else None


def make_card(
    entries: Sequence[Entry],
    slo: Mapping[str, float],
    scales: Sequence[float],
    target_rps: float | None,
    gpu_hour_usd: float | None,
) -> Card:
    """The card of ``entries`` (each with its capacity per tier): the plan at the workload's SLO
    (scale 1) for ``target_rps`` requests/s at ``gpu_hour_usd`` per GPU-hour."""
    plans: dict[int, Plan] = {}
    for e in entries:
        est = e.tiers.get(1.0)
        if est is None or est.rps <= 0:
            plans[e.trial] = Plan()
            continue
        g = e.gpus_per_server
        p = Plan()
        if target_rps is not None:
            n, lo, hi = (_servers(target_rps, c) for c in (est.rps, est.high, est.low))
            p = replace(
                p,
                servers=n,
                servers_low=lo,
                servers_high=hi,
                gpus=None if n is None else n * g,
                gpus_low=None if lo is None else lo * g,
                gpus_high=None if hi is None else hi * g,
            )
        if gpu_hour_usd is not None:
            usd_per_s = g * gpu_hour_usd / 3600.0
            per_req = usd_per_s / est.rps * 1e6
            tok = e.output_tokens_per_request
            per_tok = usd_per_s / (est.rps * tok) * 1e6 if tok else None
            p = replace(p, usd_per_m_requests=per_req, usd_per_m_output_tokens=per_tok)
        plans[e.trial] = p
    base = next((e for e in entries if e.baseline), None)
    bp = plans.get(base.trial) if base is not None else None
    if base is not None and bp is not None:
        for e in entries:
            if e.baseline:
                continue
            p = plans[e.trial]
            saving = None
            if p.usd_per_m_requests is not None and bp.usd_per_m_requests:
                saving = 1.0 - p.usd_per_m_requests / bp.usd_per_m_requests
            else:  # no price: the saving in GPU time per request, the same ratio
                mine, theirs = e.tiers.get(1.0), base.tiers.get(1.0)
                if mine and theirs and mine.rps > 0 and theirs.rps > 0:
                    saving = 1.0 - (e.gpus_per_server / mine.rps) / (
                        base.gpus_per_server / theirs.rps
                    )
            saved = None
            if p.gpus is not None and bp.gpus is not None:
                saved = bp.gpus - p.gpus
            plans[e.trial] = replace(p, saving=saving, gpus_saved=saved)
    return Card(dict(slo), tuple(scales), target_rps, gpu_hour_usd, tuple(entries), plans)
