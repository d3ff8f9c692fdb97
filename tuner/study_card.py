"""A stored study's capacity card: its entries from the confirm record and the trial folders'
capacity steps, the target load (``plan.target_rps`` or a trace's peak), ``capacity_card.json``
and MLflow, and the console table. The card itself (tiers, interval, plan) is
:mod:`tuner.capacity_card`'s pure arithmetic."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import optuna
from rich.console import Console
from rich.table import Table

from tuner import stored_trial
from tuner.artifacts import TrialFolder
from tuner.capacity import Step
from tuner.capacity_card import (
    AT_MOST,
    OUTSIDE,
    Card,
    Entry,
    Estimate,
    Plan,
    TierCapacity,
    estimate,
    limits,
    make_card,
    tiers_of,
)
from tuner.config import TunerConfig
from tuner.confirm import round_values
from tuner.engine import pool
from tuner.precheck import with_fixed
from tuner.records import Candidate, ConfirmResult
from tuner.score import objective_metric

__all__ = [
    "entry",
    "peak_rps",
    "print_card",
    "publish_card",
    "read_steps",
    "slo_limits",
    "study_card",
    "target_of",
]

log = logging.getLogger(__name__)


def read_steps(folder: Path) -> list[Step]:
    """The capacity steps a trial folder stored (``capacity.json``); [] without one."""
    path = TrialFolder(folder).capacity
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    return [Step.from_row(r) for r in data.get("steps", [])]


def slo_limits(cfg: TunerConfig) -> dict[str, float]:
    return {**limits(cfg.workload.slo), "percentile": float(cfg.objective.slo_percentile)}


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
    server) where there are any, and then no stricter tier above it; no tier lower than a
    stricter one."""
    tiers: dict[float, Estimate] = {}
    scales = sorted({*cfg.plan.slo_scales, 1.0})
    each = [tiers_of(steps, cfg.objective, cfg.workload.slo, scales) for steps in searches]
    anchor = estimate([TierCapacity(1.0, v, v, v) for v in rounds])  # None without rounds
    for s in scales:
        est = anchor if s == 1.0 and anchor is not None else estimate([t[s] for t in each])
        if est is None:
            continue
        if anchor is not None and s < 1.0 and est.outside != "below" and est.rps > anchor.rps:
            # a stricter tier serves no more than the workload's, which fresh servers measured:
            # one search's bracket there can be wide (a trial that lost the incumbent probe
            # read 123 req/s between 40 that held and a pruned step, where its confirm servers
            # held 69 at the looser SLOs, and raised the workload's tier with it, 2026-12-05)
            low = min(est.low, anchor.rps)
            est = replace(est, rps=anchor.rps, low=low, high=anchor.rps, outside="at_most")
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
    """The card of a capacity study (``capacity_rps`` or ``capacity_per_gpu_rps`` an
    objective): one entry per confirm candidate (its tiers from its search trial's steps, its
    capacity at the workload's SLO from the confirm rounds where they measured it; a server's
    requests/s, its GPUs counted in the plan). None when the study has no capacity steps."""
    if objective_metric(study.metric_names or [o.metric for o in cfg.objective.objectives]) is None:
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
        gpus = pool.gpus_per_server(with_fixed(cfg, c.params, baseline=c.baseline))
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
    if est.outside == "at_most":
        return f"≤ {est.rps:,.1f} [{est.low:,.1f}–] ({AT_MOST})"
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
        row = [e.label + (f", {e.gpus_per_server} GPUs" if e.gpus_per_server > 1 else "")]
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
