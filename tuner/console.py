"""What the user sees in the console: a line per trial with the live best and an ETA
(:func:`progress_line`, :func:`live_best`, :func:`hms`), and after the search the trials of this run
with their GPU time (:func:`print_summary`), the Pareto-best trials of the whole study
(:func:`print_pareto`, Optuna's ``best_trials``, which honours the constraints) and the confirm
verdicts with the recommended config (:func:`print_confirm`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from rich.console import Console
from rich.table import Table

from tuner import replay, stored_trial
from tuner.capacity import shown
from tuner.config import TunerConfig
from tuner.confirm import round_values
from tuner.export import recommended_file
from tuner.records import Candidate, ConfirmResult, TrialResult
from tuner.score import OBJECTIVES as CAPACITY_OBJECTIVES
from tuner.score import PER_GPU
from tuner.space import changed_params
from tuner.startup import run_summary, summary_line
from tuner.stored_study import pareto_rows
from tuner.verdict import Verdict, gain_text, line

__all__ = [
    "fmt_metric",
    "gain_text",
    "gpu_time",
    "hms",
    "live_best",
    "parent_summary",
    "print_confirm",
    "print_pareto",
    "print_summary",
    "progress_line",
]

CENSORED = "capacity_censored"

_UNITS = {"output_throughput": "tok/s", "goodput": "req/s", "request_throughput": "req/s"}


def fmt_metric(name: str, v: float | None, metrics: Mapping[str, Any] | None = None) -> str:
    """``v`` with its unit; a ``capacity_rps`` as :func:`tuner.capacity.shown` with ``metrics``'
    ``capacity_censored`` and ``capacity_rps_high``: ``< X (~v)`` (the incumbent probe lost:
    below X) or ``>= v`` (held at every load tried); a ``capacity_per_gpu_rps`` likewise, per
    GPU."""
    if v is None:
        return "-"
    if name.endswith("_ms"):
        return f"{v:,.0f} ms"
    if name == "capacity_rps":
        m = metrics or {}
        return f"{shown(v, m.get(CENSORED), m.get('capacity_rps_high'))} req/s"
    if name == PER_GPU:  # censored as its capacity_rps is
        return f"{shown(v, (metrics or {}).get(CENSORED))} req/s/GPU"
    return f"{v:,.1f} {_UNITS.get(name, '')}".strip()


def progress_line(r: TrialResult, i: int | None, n: int, cfg: TunerConfig) -> str:
    """``i`` is None for a config rejected before launch that does not count toward ``n``."""
    head = f"[{i}/{n}] trial {r.number}" if i is not None else f"[not counted] trial {r.number}"
    if r.baseline:
        head += " (baseline)"
    params = changed_params(r.params, cfg.space)
    if r.pruned:
        return f"{head}: PRUNED ({r.pruned}) | {params}"
    if not r.ok:
        return f"{head}: FAILED {r.failure_reason}: {r.failure_detail} | {params}"
    objs = ", ".join(
        f"{o.metric} {fmt_metric(o.metric, r.metrics.get(o.metric), r.metrics)}"
        for o in cfg.objective.objectives
    )
    launch = r.launch
    start = f"start {launch.startup_s:.1f} s" if launch else ""
    kv = f"KV {launch.facts.kv_cache_tokens:,}" if launch and launch.facts.kv_cache_tokens else ""
    ok = f"{r.metrics.get('success_rate', 0.0):.0%} ok"
    return f"{head}: {objs}, {ok} ({', '.join(x for x in (start, kv) if x)}) | {params}"


def live_best(study: optuna.Study, cfg: TunerConfig) -> str:
    """The best feasible value of each objective so far, and the Pareto front's size."""
    objs = cfg.objective.objectives
    feasible = [t for t in study.trials if stored_trial.feasible(t)]
    if not feasible:
        return "best: no feasible trial yet"
    # a capacity censored above (its incumbent probe lost) is an estimate under a bound: never
    # the best capacity
    bounded = [t for t in feasible if (stored_trial.metric(t, CENSORED) or 0.0) >= 0] or feasible
    parts = []
    for i, o in enumerate(objs):
        sign = 1.0 if o.direction == "maximize" else -1.0
        pool = bounded if o.metric in CAPACITY_OBJECTIVES else feasible
        t = max(pool, key=lambda t: sign * float(t.values[i]))  # noqa: B023 - used at once
        shown_value = fmt_metric(o.metric, t.values[i], stored_trial.metrics(t))
        parts.append(f"{o.metric} {shown_value} (trial {t.number})")
    front = f", Pareto front {len(study.best_trials)} trial(s)" if len(objs) > 1 else ""
    return "best: " + ", ".join(parts) + front


def _result_text(r: TrialResult) -> str:
    if r.pruned:
        return "PRUNED"
    if r.ok:
        return "ok"
    return f"FAILED {r.failure_reason}" + ("" if r.launched else " (not launched)")


def parent_summary(results: Sequence[TrialResult]) -> dict[str, float]:
    """A run's counts of trials (run, ok, failed, pruned) and GPU time, for its parent run."""
    ok = [r for r in results if r.ok and not r.pruned]
    return {
        "trials_run": float(len(results)),
        "trials_ok": float(len(ok)),
        "trials_failed": float(sum(not r.ok for r in results)),
        "trials_pruned": float(sum(bool(r.pruned) for r in results)),
        **gpu_time(results),
        **run_summary(results),
    }


def hms(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour."""
    m, sec = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def gpu_time(results: Sequence[TrialResult]) -> dict[str, float]:
    """GPU-seconds held by servers, and the share spent on launches that failed."""
    total = sum(r.server_s for r in results)
    failed = sum(r.server_s for r in results if not r.ok and not r.pruned)
    return {
        "gpu_s_total": total,
        "gpu_s_failed_launches": failed,
        "gpu_s_failed_share": failed / total if total else 0.0,
        "trials_not_launched": float(sum(r.rejected_before_launch for r in results)),
    }


def print_summary(
    study: optuna.Study,
    results: Sequence[TrialResult],
    cfg: TunerConfig,
    console: Console | None = None,
) -> None:
    """The trials of this run (``results``), the GPU time, the client's lag and the Pareto
    table of the whole ``study``."""
    console = console or Console(width=160)
    objs = [o.metric for o in cfg.objective.objectives]
    t = Table(title=f"Trials of this run — study {study.study_name}")
    for col in ("#", "result", *objs, "startup s", "KV tokens", "KV predicted", "params"):
        t.add_column(col, overflow="fold")
    for r in results:
        launch = r.launch
        t.add_row(
            str(r.number),
            _result_text(r),
            *(
                fmt_metric(m, r.metrics.get(m), r.metrics) if r.ok and not r.pruned else "-"
                for m in objs
            ),
            f"{launch.startup_s:.1f}" if launch else "-",
            f"{launch.facts.kv_cache_tokens:,}" if launch and launch.facts.kv_cache_tokens else "-",
            f"{r.predicted_kv_tokens:,}" if r.predicted_kv_tokens is not None else "-",
            changed_params(r.params, cfg.space),
        )
    console.print(t)
    g = gpu_time(results)
    sim = cfg.engine.kind == "sim"  # its servers hold no GPU: the time is the simulator's
    held = "Simulated GPU time" if sim else "GPU time"
    console.print(
        f"{held} held by servers: {g['gpu_s_total']:,.1f} s, of which "
        f"{g['gpu_s_failed_launches']:,.1f} s ({g['gpu_s_failed_share']:.1%}) on launches that "
        f"failed; {g['trials_not_launched']:.0f} trial(s) rejected before launch by the precheck."
    )
    console.print(summary_line(run_summary(results), simulated=sim))
    _print_client_lag(results, console)
    print_pareto(study, cfg, console)


def _print_client_lag(results: Sequence[TrialResult], console: Console) -> None:
    """The replay client's worst lag over the run's trials, and the trials it may have skewed."""
    lags = [
        (r.number, r.metrics["client_lag_p99_ms"])
        for r in results
        if "client_lag_p99_ms" in r.metrics
    ]
    if not lags:
        return
    worst_n, worst = max(lags, key=lambda x: x[1])
    limit = replay.CLIENT_LAG_WARN_MS
    line = f"Replay client: its event loop ran at most {worst:.1f} ms late at p99 (trial {worst_n})"
    busy = sorted({n for n, v in lags if v > limit})
    if busy:
        line += (
            f"; over {limit:g} ms in trial(s) {', '.join(map(str, busy))}, whose latencies "
            "include the client's own delay: raise workload.client_processes"
        )
    console.print(line)


def print_pareto(study: optuna.Study, cfg: TunerConfig, console: Console) -> None:
    objs = list(study.metric_names or [o.metric for o in cfg.objective.objectives])
    rows = pareto_rows(study, cfg)
    b = Table(title=f"Pareto-best trials of study {study.study_name} ({len(rows)})")
    for col in ("#", *objs, *(f"{m} vs baseline" for m in objs), "params"):
        b.add_column(col, overflow="fold")
    for row in rows:
        gains = [row.get(f"{m}_vs_baseline_pct") for m in objs]
        b.add_row(
            str(row["trial"]),
            *(fmt_metric(m, row[m], row) for m in objs),
            *(f"{x:+.1f} %" if x is not None else "-" for x in gains),
            changed_params(row["params"], cfg.space),
        )
    if rows:
        console.print(b)
    else:
        console.print("No feasible trial yet: every trial failed or violated a constraint.")


def _rounds_held(r: ConfirmResult) -> tuple[int, int]:
    """Rounds in which every run of ``r`` held, and its rounds."""
    ok: dict[int, bool] = {}
    for row in r.runs:
        rnd = int(row.get("round", 1))
        ok[rnd] = ok.get(rnd, True) and bool(row.get("ok"))
    return sum(ok.values()), len(ok)


def print_confirm(
    results: Sequence[ConfirmResult],
    candidates: Sequence[Candidate],
    best: Candidate | None,
    out_dir: Path,
    console: Console,
    picks: Sequence[str] = (),
    decided: Verdict | None = None,
) -> None:
    """The confirm table (each candidate's value per round on the verdict's metric, its gain over
    the defaults with the interval, the worst run's key metrics), the verdict line and the
    recommended config."""
    if results:
        metric = decided.metric if decided is not None else "goodput"
        higher = decided.higher if decided is not None else True
        t = Table(
            title="Confirm: the picks under stress, once per round on a fresh server "
            f"({metric} per round: its worst run)"
        )
        cols = (
            "#",
            "picks",
            "held",
            f"{metric} per round",
            "vs defaults",
            "goodput",
            "tok/s",
            "TTFT p95",
            "TPOT p95",
            "why",
        )
        for col in cols:
            t.add_column(col, overflow="fold")
        won = None  # the rounds the recommended pick ran, when the stage stopped on its gain
        if decided is not None and decided.kind == "gain":
            rec = next((r for r in results if r.trial == decided.recommended), None)
            won = None if rec is None else _rounds_held(rec)[1]
        for r in results:
            w = r.worst
            per_round = round_values(r, metric, higher)
            gain = decided.gains.get(r.trial) if decided is not None else None
            if decided is not None and r.trial == decided.baseline:
                vs = "(the reference)"
            else:
                vs = gain_text(gain)
            if gain is not None and decided is not None and gain.claimed(decided.min_effect):
                vs += " ✓"
            n_held, n_rounds = _rounds_held(r)
            t.add_row(
                str(r.trial),
                ", ".join(r.picks),
                f"{n_held}/{n_rounds}" + ("" if r.passed else " DEMOTED"),
                " / ".join("—" if v is None else _fmt_value(metric, v) for v in per_round),
                vs,
                fmt_metric("goodput", w.get("goodput")),
                fmt_metric("output_throughput", w.get("output_throughput")),
                fmt_metric("ttft_p95_ms", w.get("ttft_p95_ms")),
                fmt_metric("tpot_p95_ms", w.get("tpot_p95_ms")),
                r.reason or _stopped(n_rounds, decided, won),
            )
        console.print(t)
    if decided is not None and results:  # not markup: rich would swallow its [notes]
        console.print(line(decided), markup=False)
    if best is None:
        if candidates:
            console.print("No pick held up under stress: nothing is recommended.")
        return
    unconfirmed = "" if results else ", not confirmed on fresh servers"  # no confirm stage ended
    console.print(
        f"Recommended: trial {best.trial} ({', '.join(best.picks)}){unconfirmed}: "
        f"vllm serve --config {out_dir / recommended_file(best.picks, picks)}"
    )


def _stopped(n_rounds: int, decided: Verdict | None, won: int | None = None) -> str:
    """Why a candidate ran fewer rounds than the stage (:class:`tuner.confirm_stop.EarlyStop`):
    the stage stopped on a settled gain after ``won`` rounds (the recommended pick's, when it ran
    fewer), or its gain settled below ``confirm.min_effect``, or every pick had (the defaults)."""
    if decided is None or n_rounds >= decided.rounds:
        return ""
    if won is not None and n_rounds == won:
        return f"the gain settled after {n_rounds} rounds: no more (confirm.stop_winner)"
    return f"settled after {n_rounds} rounds: no more (confirm.stop_losers)"


def _fmt_value(name: str, v: float) -> str:
    """A value in a narrow column: no unit, a thousands separator."""
    return f"{v:,.0f}" if name.endswith("_ms") or abs(v) >= 1000 else f"{v:,.1f}"
