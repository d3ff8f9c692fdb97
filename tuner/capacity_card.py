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
  from the interval's ends), GPUs = servers × ``tensor_parallel_size``; with
  ``plan.gpu_hour_usd``, the cost per 1M output tokens and per 1M requests served at capacity,
  and each pick's saving against vLLM's defaults.

:func:`tier_capacity`, :func:`estimate` and :func:`make_card` are pure (numbers in, card out);
:func:`study_card` assembles a study's card from its confirm record and trial folders.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from rich.console import Console
from rich.table import Table

from tuner import stored_trial
from tuner.artifacts import TrialFolder
from tuner.capacity import Step, from_steps
from tuner.config import ObjectiveConfig, SLOConfig, TunerConfig
from tuner.confirm import round_values
from tuner.records import Candidate, ConfirmResult
from tuner.score import slo_margins
from tuner.verdict import CONFIDENCE

__all__ = [
    "Card",
    "Entry",
    "Estimate",
    "Plan",
    "TierCapacity",
    "estimate",
    "make_card",
    "peak_rps",
    "print_card",
    "publish_card",
    "read_steps",
    "scaled",
    "study_card",
    "target_of",
    "tier_capacity",
    "tiers_of",
]

log = logging.getLogger(__name__)

OUTSIDE = "outside the measured loads"


def scaled(slo: SLOConfig, scale: float) -> SLOConfig:
    """The SLO limits × ``scale`` (< 1 stricter, > 1 looser); limits not set stay unset."""
    return replace(
        slo,
        **{k: (None if v is None else v * scale) for k, v in asdict(slo).items()},
    )


def _limits(slo: SLOConfig) -> dict[str, float]:
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
    bracket); ``outside`` as :class:`TierCapacity`'s when any server's was."""

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


# --- a study's card ------------------------------------------------------------------------------


def read_steps(folder: Path) -> list[Step]:
    """The capacity steps a trial folder stored (``capacity.json``); [] without one."""
    path = TrialFolder(folder).capacity
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    return [Step.from_row(r) for r in data.get("steps", [])]


def gpus_per_server(params: Mapping[str, Any], fixed_args: Mapping[str, Any]) -> int:
    """``tensor_parallel_size`` of the config (searched, else fixed in ``model.fixed_args``)."""
    tp = params.get("tensor_parallel_size")
    if tp is None:
        tp = fixed_args.get("tensor-parallel-size", fixed_args.get("tensor_parallel_size"))
    return max(1, int(tp or 1))


def slo_limits(cfg: TunerConfig) -> dict[str, float]:
    return {**_limits(cfg.workload.slo), "percentile": float(cfg.objective.slo_percentile)}


def entry(
    trial: int,
    label: str,
    baseline: bool,
    gpus: int,
    searches: Sequence[Sequence[Step]],
    cfg: TunerConfig,
    rounds: Sequence[float] = (),
    tokens: float | None = None,
) -> Entry:
    """An :class:`Entry` from the steps of one or more capacity searches of the config; its
    capacity at the workload's SLO from ``rounds`` (the confirm stage's values, one per fresh
    server) where there are any."""
    tiers: dict[float, Estimate] = {}
    scales = sorted({*cfg.plan.slo_scales, 1.0})
    each = [tiers_of(steps, cfg.objective, cfg.workload.slo, scales) for steps in searches]
    for s in scales:
        per = [t[s] for t in each]
        if s == 1.0 and rounds:
            per = [TierCapacity(1.0, v, v, v) for v in rounds]
        est = estimate(per)
        if est is None:
            continue
        below = [t for k, t in tiers.items() if k < s and t.outside is None]
        if below and est.outside != "below" and est.rps < below[-1].rps:
            # never lower at a looser tier (see tiers_of); the workload's tier comes from the
            # confirm rounds, the others from the search's steps
            prev = below[-1]
            est = replace(
                est, rps=prev.rps, low=max(est.low, prev.low), high=max(est.high, prev.rps)
            )
        tiers[s] = est
    return Entry(trial, label, baseline, gpus, tiers, tokens)


def peak_rps(arrival_s: Sequence[float], window_s: float) -> float | None:
    """The most arrivals in any ``window_s`` seconds, per second (None for no arrival); a trace
    shorter than the window: its arrivals over its own span (at least 1 s)."""
    times = sorted(float(t) for t in arrival_s)
    if not times:
        return None
    span = times[-1] - times[0]
    if span < window_s:
        return len(times) / max(span, 1.0)
    most, j = 0, 0
    for i, t in enumerate(times):  # the window starting at each arrival
        while j < len(times) and times[j] < t + window_s:
            j += 1
        most = max(most, j - i)
    return most / window_s


def target_of(cfg: TunerConfig) -> tuple[float | None, str | None]:
    """The load to plan for and where it comes from: ``plan.target_rps``, else a trace
    workload's peak rate (:func:`peak_rps` at the trace's own speed), else none."""
    if cfg.plan.target_rps is not None:
        return cfg.plan.target_rps, "plan.target_rps"
    t = cfg.workload.trace
    if t is None:
        return None, None
    from tuner.workload.trace import load_trace

    arrivals = load_trace(t).arrival_s / t.time_scale  # the trace's own times, not the replay's
    peak = peak_rps(arrivals.tolist(), cfg.plan.peak_window_s)
    return peak, f"the trace's peak over {cfg.plan.peak_window_s:g} s"


def _tokens(metrics: Mapping[str, float]) -> float | None:
    v = metrics.get("output_tokens_mean")
    if v:
        return float(v)
    out, req = metrics.get("output_throughput"), metrics.get("request_throughput")
    return float(out) / float(req) if out and req else None


def study_card(
    study: optuna.Study,
    cfg: TunerConfig,
    trial_dirs: Mapping[int, Path],
    candidates: Sequence[Candidate],
    results: Sequence[ConfirmResult],
) -> Card | None:
    """The card of a capacity study (``capacity_rps`` an objective): one entry per confirm
    candidate (its tiers from its search trial's steps, its capacity at the workload's SLO from
    the confirm rounds where they measured it). None when the study has no capacity steps."""
    if "capacity_rps" not in (study.metric_names or [o.metric for o in cfg.objective.objectives]):
        return None
    by_number = {t.number: t for t in study.trials}
    by_result = {r.trial: r for r in results}
    entries = []
    for c in candidates:
        t = by_number.get(c.trial)
        folder = trial_dirs.get(c.trial)
        steps = read_steps(folder) if folder is not None else []
        if t is None or not steps:
            continue
        r = by_result.get(c.trial)
        rounds: list[float] = []
        if r is not None:
            rounds = [v for v in round_values(r, "capacity_rps", True) if v is not None and v > 0]
        label = "vLLM defaults" if c.baseline else ", ".join(c.picks)
        gpus = gpus_per_server(c.params, cfg.model.fixed_args)
        entries.append(
            entry(
                c.trial,
                f"trial {c.trial} ({label})",
                bool(c.baseline),
                gpus,
                [steps],
                cfg,
                rounds,
                _tokens(stored_trial.metrics(t)),
            )
        )
    if not entries:
        return None
    p = cfg.plan
    scales = sorted({*p.slo_scales, 1.0})
    target, source = target_of(cfg)
    card = make_card(entries, slo_limits(cfg), scales, target, p.gpu_hour_usd)
    return replace(card, target_source=source)


def publish_card(
    study: optuna.Study,
    cfg: TunerConfig,
    out_dir: Path,
    trial_dirs: Mapping[int, Path],
    candidates: Sequence[Candidate],
    results: Sequence[ConfirmResult],
    files: dict[str, Path],
) -> Card | None:
    """:func:`study_card`, written to ``out_dir/capacity_card.json`` (added to ``files``); None
    when the study has none or it could not be made (logged: a report never fails for it)."""
    try:
        card = study_card(study, cfg, trial_dirs, candidates, results)
    except Exception as exc:
        log.warning("capacity card not made: %s: %s", type(exc).__name__, exc)
        return None
    if card is None:
        return None
    path = out_dir / "capacity_card.json"
    path.write_text(json.dumps(card.as_dict(), indent=2) + "\n")
    files[path.name] = path
    return card


# --- the console table ---------------------------------------------------------------------------


def _range(est: Estimate | None) -> str:
    if est is None:
        return "—"
    if est.outside == "below":
        return f"< {est.high:,.1f} ({OUTSIDE})"
    if est.outside == "above":
        return f"≥ {est.rps:,.1f} ({OUTSIDE})"
    return f"{est.rps:,.1f} [{est.low:,.1f}–{est.high:,.1f}]"


def _span(n: int | None, lo: int | None, hi: int | None) -> str:
    if n is None:
        return "—"
    return f"{n}" if lo == hi == n else f"{n} [{lo}–{hi}]"


def print_card(card: Card, console: Console) -> None:
    """The card as a table: capacity per SLO tier (req/s, the interval), then the plan's columns
    (servers and GPUs for the target, cost per 1M output tokens and requests, saving)."""
    tiers = ", ".join(f"×{s:g}" + (" (the workload's)" if s == 1.0 else "") for s in card.scales)
    limits = ", ".join(f"{k} {v:g}" for k, v in card.metric_slo.items() if k != "percentile")
    pct = card.metric_slo.get("percentile", 0)
    t = Table(
        title=f"Capacity card: req/s within the SLOs ({limits}, p{pct:g}) "
        f"at the tiers {tiers}; [95 % interval over fresh servers, or one search's bracket]"
    )
    t.add_column("config", overflow="fold")
    for s in card.scales:
        t.add_column(f"SLO ×{s:g}", overflow="fold")
    target = f"{card.target_rps:,.4g} req/s" if card.target_rps is not None else None
    if target and card.target_source and card.target_source != "plan.target_rps":
        target += f" ({card.target_source})"
    if target:
        t.add_column(f"servers for {target}")
        t.add_column("GPUs")
    if card.gpu_hour_usd is not None:
        t.add_column(f"$/1M out tok (${card.gpu_hour_usd:g}/GPU-h)")
        t.add_column("$/1M req")
    t.add_column("vs defaults")
    for e in card.entries:
        p = card.plans.get(e.trial, Plan())
        row = [e.label + (f", TP {e.gpus_per_server}" if e.gpus_per_server > 1 else "")]
        row += [_range(e.tiers.get(s)) for s in card.scales]
        if target:
            row += [
                _span(p.servers, p.servers_low, p.servers_high),
                _span(p.gpus, p.gpus_low, p.gpus_high),
            ]
        if card.gpu_hour_usd is not None:
            row += [
                "—" if p.usd_per_m_output_tokens is None else f"${p.usd_per_m_output_tokens:,.3g}",
                "—" if p.usd_per_m_requests is None else f"${p.usd_per_m_requests:,.4g}",
            ]
        if e.baseline:
            row.append("(the reference)")
        elif p.saving is None:
            row.append("—")
        else:
            gpus = "" if p.gpus_saved is None else f", {-p.gpus_saved:+d} GPUs"
            row.append(f"{-p.saving:+.1%} cost per request{gpus}")
        t.add_row(*row)
    console.print(t)
