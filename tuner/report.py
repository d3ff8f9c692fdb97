"""What the user sees: a line per trial and, at the end, the trials of this run and the Pareto-best
trials of the whole study (Optuna's ``best_trials``, which honours the constraints)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from tuner.config import TunerConfig
from tuner.records import TrialResult

if TYPE_CHECKING:
    from tuner.study import StudyOutcome

__all__ = [
    "baseline_trial",
    "changed_params",
    "gpu_time",
    "pareto_figure",
    "pareto_rows",
    "print_summary",
    "progress_line",
    "trials_frame",
]

_UNITS = {"output_throughput": "tok/s", "goodput": "req/s", "request_throughput": "req/s"}


def _fmt_metric(name: str, v: float | None) -> str:
    if v is None:
        return "-"
    if name.endswith("_ms"):
        return f"{v:,.0f} ms"
    return f"{v:,.1f} {_UNITS.get(name, '')}".strip()


def changed_params(params: Mapping[str, Any], cfg: TunerConfig) -> str:
    """Params that differ from vLLM's defaults, as ``name=value`` (the rest are defaults)."""
    parts = []
    for k, v in params.items():
        spec = cfg.space.params.get(k)
        if spec is not None and v != spec.default:
            parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts) or "(vLLM defaults)"


def progress_line(r: TrialResult, i: int, n: int, cfg: TunerConfig) -> str:
    head = f"[{i}/{n}] trial {r.number}"
    if r.baseline:
        head += " (baseline)"
    params = changed_params(r.params, cfg)
    if r.pruned:
        return f"{head}: PRUNED ({r.pruned}) | {params}"
    if not r.ok:
        return f"{head}: FAILED {r.failure_reason}: {r.failure_detail} | {params}"
    objs = ", ".join(
        f"{o.metric} {_fmt_metric(o.metric, r.metrics.get(o.metric))}"
        for o in cfg.objective.objectives
    )
    launch = r.launch
    start = f"start {launch.startup_s:.1f} s" if launch else ""
    kv = f"KV {launch.kv_cache_tokens:,}" if launch and launch.kv_cache_tokens else ""
    ok = f"{r.metrics.get('success_rate', 0.0):.0%} ok"
    return f"{head}: {objs}, {ok} ({', '.join(x for x in (start, kv) if x)}) | {params}"


def _result_text(r: TrialResult) -> str:
    if r.pruned:
        return "PRUNED"
    if r.ok:
        return "ok"
    return f"FAILED {r.failure_reason}" + ("" if r.launched else " (not launched)")


def gpu_time(results: Sequence[TrialResult]) -> dict[str, float]:
    """GPU-seconds held by servers, and the share spent on launches that failed."""
    total = sum(r.server_s for r in results)
    failed = sum(r.server_s for r in results if not r.ok and not r.pruned)
    return {
        "gpu_s_total": total,
        "gpu_s_failed_launches": failed,
        "gpu_s_failed_share": failed / total if total else 0.0,
        "trials_not_launched": float(sum(not r.launched for r in results)),
    }


def baseline_trial(study: Any) -> Any | None:
    """The study's feasible baseline trial (vLLM defaults), if it has one."""
    for t in study.trials:
        feasible = all(v <= 0 for v in t.constraints.values())
        if t.user_attrs.get("baseline") and t.values is not None and feasible:
            return t
    return None


def pareto_rows(study: Any, cfg: TunerConfig) -> list[dict[str, Any]]:
    """Each Pareto-best trial with its values and its gain over the baseline in %."""
    objs = [o.metric for o in cfg.objective.objectives]
    base = baseline_trial(study)
    rows = []
    for tr in sorted(study.best_trials, key=lambda x: x.number):
        row: dict[str, Any] = {"trial": tr.number, "params": dict(tr.params)}
        for i, (m, v) in enumerate(zip(objs, tr.values or [], strict=False)):
            row[m] = v
            if base is not None and base.values:
                b = base.values[i]
                row[f"{m}_vs_baseline_pct"] = (v - b) / abs(b) * 100.0 if b else None
        rows.append(row)
    return rows


def print_summary(outcome: StudyOutcome, cfg: TunerConfig, console: Console | None = None) -> None:
    console = console or Console(width=160)
    objs = [o.metric for o in cfg.objective.objectives]
    t = Table(title=f"Trials of this run — study {outcome.study.study_name}")
    for col in ("#", "result", *objs, "startup s", "KV tokens", "KV predicted", "params"):
        t.add_column(col, overflow="fold")
    for r in outcome.results:
        launch = r.launch
        t.add_row(
            str(r.number),
            _result_text(r),
            *(_fmt_metric(m, r.metrics.get(m)) if r.ok and not r.pruned else "-" for m in objs),
            f"{launch.startup_s:.1f}" if launch else "-",
            f"{launch.kv_cache_tokens:,}" if launch and launch.kv_cache_tokens else "-",
            f"{r.predicted_kv_tokens:,}" if r.predicted_kv_tokens is not None else "-",
            changed_params(r.params, cfg),
        )
    console.print(t)
    g = gpu_time(outcome.results)
    console.print(
        f"GPU time held by servers: {g['gpu_s_total']:,.1f} s, of which "
        f"{g['gpu_s_failed_launches']:,.1f} s ({g['gpu_s_failed_share']:.1%}) on launches that "
        f"failed; {g['trials_not_launched']:.0f} trial(s) rejected before launch by the precheck."
    )
    rows = pareto_rows(outcome.study, cfg)
    b = Table(title=f"Pareto-best trials of study {outcome.study.study_name} ({len(rows)})")
    for col in ("#", *objs, *(f"{m} vs baseline" for m in objs), "params"):
        b.add_column(col, overflow="fold")
    for row in rows:
        gains = [row.get(f"{m}_vs_baseline_pct") for m in objs]
        b.add_row(
            str(row["trial"]),
            *(_fmt_metric(m, row[m]) for m in objs),
            *(f"{x:+.1f} %" if x is not None else "-" for x in gains),
            changed_params(row["params"], cfg),
        )
    if rows:
        console.print(b)
    else:
        console.print("No feasible trial yet: every trial failed or violated a constraint.")


def trials_frame(study: Any) -> Any:
    """One row per trial: number, state, objectives, params, failure reason, KV and startup."""
    import pandas as pd

    rows = []
    names = study.metric_names or [f"value_{i}" for i in range(len(study.directions))]
    for t in study.trials:
        row: dict[str, Any] = {"number": t.number, "state": t.state.name}
        for n, v in zip(names, t.values or [None] * len(names), strict=False):
            row[n] = v
        row["feasible"] = bool(t.constraints) and all(v <= 0 for v in t.constraints.values())
        for k in ("failure_reason", "kv_cache_tokens", "predicted_kv_tokens", "startup_s"):
            row[k] = t.user_attrs.get(k)
        row.update(t.params)
        rows.append(row)
    return pd.DataFrame(rows)


def pareto_figure(study: Any) -> Any:
    """Optuna's Pareto-front plot (feasible best / feasible / infeasible colours)."""
    import optuna

    return optuna.visualization.plot_pareto_front(
        study, target_names=study.metric_names or None, include_dominated_trials=True
    )
