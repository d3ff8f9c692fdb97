"""What the user sees: a line per trial (with the live best and an ETA), at the end the trials of
this run, the Pareto-best trials of the whole study (Optuna's ``best_trials``, which honours the
constraints), the confirm verdicts and the recommended config; :func:`publish` writes the exports
and figures, and :func:`run_report` does all of it again from storage (``python -m tuner report``).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tuner import stored_trial
from tuner.config import TunerConfig
from tuner.confirm import Candidate, ConfirmResult, round_values
from tuner.records import TrialResult
from tuner.space import changed_params
from tuner.startup import run_summary, summary_line
from tuner.verdict import CONFIDENCE, Gain, Verdict, line, pct

log = logging.getLogger("tuner")

__all__ = [
    "Published",
    "baseline_trial",
    "gpu_time",
    "hms",
    "live_best",
    "parent_summary",
    "pareto_rows",
    "print_summary",
    "print_confirm",
    "print_pareto",
    "run_report",
    "progress_line",
    "publish",
    "store_confirm",
    "stored_confirm",
    "stored_verdict",
]

_UNITS = {"output_throughput": "tok/s", "goodput": "req/s", "request_throughput": "req/s"}


def _fmt_metric(name: str, v: float | None) -> str:
    if v is None:
        return "-"
    if name.endswith("_ms"):
        return f"{v:,.0f} ms"
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
        f"{o.metric} {_fmt_metric(o.metric, r.metrics.get(o.metric))}"
        for o in cfg.objective.objectives
    )
    launch = r.launch
    start = f"start {launch.startup_s:.1f} s" if launch else ""
    kv = f"KV {launch.facts.kv_cache_tokens:,}" if launch and launch.facts.kv_cache_tokens else ""
    ok = f"{r.metrics.get('success_rate', 0.0):.0%} ok"
    return f"{head}: {objs}, {ok} ({', '.join(x for x in (start, kv) if x)}) | {params}"


def live_best(study: Any, cfg: TunerConfig) -> str:
    """The best feasible value of each objective so far, and the Pareto front's size."""
    objs = cfg.objective.objectives
    feasible = [t for t in study.trials if stored_trial.feasible(t)]
    if not feasible:
        return "best: no feasible trial yet"
    parts = []
    for i, o in enumerate(objs):
        sign = 1.0 if o.direction == "maximize" else -1.0
        t = max(feasible, key=lambda t: sign * float(t.values[i]))  # noqa: B023 - used at once
        parts.append(f"{o.metric} {_fmt_metric(o.metric, t.values[i])} (trial {t.number})")
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


def baseline_trial(study: Any) -> Any | None:
    """The study's feasible baseline trial (vLLM defaults), if it has one."""
    return next(
        (t for t in study.trials if stored_trial.is_baseline(t) and stored_trial.feasible(t)),
        None,
    )


def pareto_rows(study: Any, cfg: TunerConfig) -> list[dict[str, Any]]:
    """Each Pareto-best trial with its values and its gain over the baseline in %."""
    objs = list(study.metric_names or [o.metric for o in cfg.objective.objectives])
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


def print_summary(
    study: Any, results: Sequence[TrialResult], cfg: TunerConfig, console: Console | None = None
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
            *(_fmt_metric(m, r.metrics.get(m)) if r.ok and not r.pruned else "-" for m in objs),
            f"{launch.startup_s:.1f}" if launch else "-",
            f"{launch.facts.kv_cache_tokens:,}" if launch and launch.facts.kv_cache_tokens else "-",
            f"{r.predicted_kv_tokens:,}" if r.predicted_kv_tokens is not None else "-",
            changed_params(r.params, cfg.space),
        )
    console.print(t)
    g = gpu_time(results)
    console.print(
        f"GPU time held by servers: {g['gpu_s_total']:,.1f} s, of which "
        f"{g['gpu_s_failed_launches']:,.1f} s ({g['gpu_s_failed_share']:.1%}) on launches that "
        f"failed; {g['trials_not_launched']:.0f} trial(s) rejected before launch by the precheck."
    )
    console.print(summary_line(run_summary(results)))
    _print_client_lag(results, console)
    print_pareto(study, cfg, console)


def _print_client_lag(results: Sequence[TrialResult], console: Console) -> None:
    """The replay client's worst lag over the run's trials, and the trials it may have skewed."""
    from tuner import replay

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


def print_pareto(study: Any, cfg: TunerConfig, console: Console) -> None:
    objs = list(study.metric_names or [o.metric for o in cfg.objective.objectives])
    rows = pareto_rows(study, cfg)
    b = Table(title=f"Pareto-best trials of study {study.study_name} ({len(rows)})")
    for col in ("#", *objs, *(f"{m} vs baseline" for m in objs), "params"):
        b.add_column(col, overflow="fold")
    for row in rows:
        gains = [row.get(f"{m}_vs_baseline_pct") for m in objs]
        b.add_row(
            str(row["trial"]),
            *(_fmt_metric(m, row[m]) for m in objs),
            *(f"{x:+.1f} %" if x is not None else "-" for x in gains),
            changed_params(row["params"], cfg.space),
        )
    if rows:
        console.print(b)
    else:
        console.print("No feasible trial yet: every trial failed or violated a constraint.")


# --- after the search: confirm verdicts, exports, figures (also `python -m tuner report`) -------


@dataclass(frozen=True)
class Published:
    """What :func:`publish` wrote and chose."""

    files: dict[str, Path]
    recommended: Candidate | None
    results: tuple[ConfirmResult, ...]
    verdict: Verdict | None = None


def stored_confirm(data: Any) -> tuple[list[Candidate], list[ConfirmResult]] | None:
    """The candidates and verdicts in the study's ``confirm`` user attr (``data``), if the
    confirm stage stored one."""
    if not isinstance(data, dict):
        return None
    cands = [
        Candidate(**{**c, "picks": tuple(c["picks"]), "serve_args": tuple(c["serve_args"])})
        for c in data.get("candidates", [])
    ]
    results = [
        ConfirmResult(**{**r, "picks": tuple(r["picks"]), "runs": tuple(r["runs"])})
        for r in data.get("results", [])
    ]
    return cands, results


def stored_verdict(data: Any) -> Verdict | None:
    """The verdict in the study's ``confirm`` user attr, if the confirm stage stored one."""
    if not isinstance(data, dict) or not isinstance(data.get("verdict"), dict):
        return None
    try:
        return Verdict.from_dict(data["verdict"])
    except (TypeError, ValueError, KeyError):
        return None


def store_confirm(
    study: Any, candidates: Sequence[Candidate], results: Sequence[ConfirmResult], cfg: TunerConfig
) -> Verdict:
    """Store the candidates, their confirm results and the verdict (decided here, on
    ``cfg.objective`` and ``confirm.min_effect``) as the study's ``confirm`` user attr."""
    from tuner.confirm import verdict
    from tuner.records import to_jsonable

    cc = cfg.confirm
    decided = verdict(results, candidates, cfg.objective, cc.min_effect, cc.rounds)
    study.set_user_attr(
        "confirm",
        {
            "load_factor": cc.load_factor,
            "duration_factor": cc.duration_factor,
            "seeds": list(cc.seeds),
            "rounds": cc.rounds,
            "min_effect": cc.min_effect,
            "n_trials": len(study.trials),
            "candidates": to_jsonable(list(candidates)),
            "results": to_jsonable(list(results)),
            "verdict": decided.as_dict(),
        },
    )
    return decided


def _gain_text(g: Gain | None, metric: str = "") -> str:
    """``+8.1 % goodput (95 % CI +4.2 … +12.3 %)`` for a :class:`~tuner.verdict.Gain`."""
    if g is None or g.value is None:
        return ""
    ci = ""
    if g.low is not None and g.high is not None:
        ci = f" ({CONFIDENCE * 100:.0f} % CI {pct(g.low)} … {pct(g.high)} %)"
    return f"{pct(g.value)} %{' ' + metric if metric else ''}{ci}"


def _rounds_held(r: ConfirmResult) -> tuple[int, int]:
    """Rounds in which every run of ``r`` held, and its rounds."""
    ok: dict[int, bool] = {}
    for row in r.runs:
        rnd = int(row.get("round", 1))
        ok[rnd] = ok.get(rnd, True) and bool(row.get("ok"))
    return sum(ok.values()), len(ok)


def _export_header(
    name: str,
    c: Candidate,
    confirmed: ConfirmResult | None,
    study: Any,
    stress: str,
    decided: Verdict | None = None,
) -> list[str]:
    lines = [
        f"best-{name}: trial {c.trial} of tuner study {study.study_name!r}"
        + (" (vLLM defaults)" if c.baseline else ""),
        "searched: "
        + ", ".join(f"{m} {_fmt_metric(m, v)}" for m, v in c.search_metrics.items() if v == v),
    ]
    if confirmed is None:
        lines.append("not stress-tested (confirm.enabled=false)")
    elif confirmed.passed:
        lines.append(
            f"confirmed under {stress}: worst "
            + ", ".join(f"{m} {_fmt_metric(m, v)}" for m, v in confirmed.worst.items())
        )
    else:
        lines.append(f"DEMOTED under {stress}: {confirmed.reason}")
    if decided is not None:
        gain = _gain_text(decided.gains.get(c.trial), decided.metric)
        if gain:
            lines.append(f"vs vLLM's defaults, re-measured in the same rounds: {gain}")
        if decided.recommended == c.trial:
            lines.append(f"recommended ({line(decided).removeprefix('Verdict: ')})")
    lines.append(f"use: vllm serve --config best-{name}.yaml")
    return [x.translate(_ASCII) for x in lines]


_ASCII = str.maketrans({"\u2212": "-", "\u2026": "...", "\u2014": "-", "\u2192": "->"})
"""The export headers stay ASCII: whatever reads ``best-*.yaml`` and ``.sh``, in any locale."""


def publish(
    study: Any,
    cfg: TunerConfig,
    out_dir: Path,
    tracker: Any,
    console: Console | None = None,
    trial_dirs: Mapping[int, Path] | None = None,
) -> Published:
    """Write pareto.json, ``best-<pick>.yaml``/``.sh`` and the figures to ``out_dir``, log them to
    the tracker's parent run, tag it with the recommended trial, and print the verdicts. Reads only
    storage and the trial folders (``trial_dirs`` adds or replaces some), so a finished study can
    be re-published."""
    from tuner import plots
    from tuner.confirm import pick, recommended, verdict
    from tuner.export import ExportError, write_export

    console = console or Console(width=160)
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    table = out_dir / "pareto.json"
    table.write_text(json.dumps(pareto_rows(study, cfg), indent=2, default=str) + "\n")
    files["pareto.json"] = table

    data = study.user_attrs.get("confirm")
    stored = stored_confirm(data)
    stress = ""
    decided: Verdict | None = None
    if stored is not None:
        candidates, results = stored
        rounds = int(data.get("rounds", 1))
        stress = (
            f"{data['load_factor']:g}x load, {data['duration_factor']:g}x duration, "
            f"seeds {data['seeds']}, {rounds} round{'s' if rounds != 1 else ''} on fresh servers"
        )
        decided = stored_verdict(data)
        n_now = len(study.trials)
        if n_now > data.get("n_trials", n_now):
            # trials came after the confirm stage (a run with confirm.enabled=false): pick
            # again; keep the results of trials picked again, and decide again on them
            candidates = pick(study, cfg.objective, cfg.confirm.picks)
            held = {r.trial: r for r in results}
            results = [held[c.trial] for c in candidates if c.trial in held]
            decided = None
        if decided is None and results:
            decided = verdict(
                results,
                candidates,
                cfg.objective,
                data.get("min_effect", cfg.confirm.min_effect),
                rounds,
            )
    else:
        candidates, results = pick(study, cfg.objective, cfg.confirm.picks), []
    verdicts = {r.trial: r for r in results}
    picks = [p for p in cfg.confirm.picks if any(p in c.picks for c in candidates)]
    for c in candidates:
        picks += [p for p in c.picks if p not in picks]
    for name in picks:
        c = next(c for c in candidates if name in c.picks)
        if not c.serve_args:
            log.warning("trial %d has no recorded command line; best-%s not written", c.trial, name)
            continue
        header = _export_header(name, c, verdicts.get(c.trial), study, stress, decided)
        try:
            yml, sh = write_export(
                out_dir, name, c.serve_args, drop=cfg.confirm.export_drop, header=header
            )
        except ExportError as exc:
            log.warning("best-%s not written: %s", name, exc)
            continue
        files[yml.name] = yml
        files[sh.name] = sh
    if results:
        path = out_dir / "confirm.json"
        path.write_text(json.dumps(data, indent=2, default=str) + "\n")
        files["confirm.json"] = path

    best = recommended(results, candidates, picks, decided)
    objectives = list(
        zip(
            study.metric_names or [o.metric for o in cfg.objective.objectives],
            [d.name.lower() for d in study.directions],
            strict=False,
        )
    )
    local = {t.number: d for t in study.trials if (d := stored_trial.trial_dir(t)) is not None}
    trial_dirs = {**local, **(trial_dirs or {})}
    shown = [n for n in (best.trial if best else None, _baseline_number(study)) if n is not None]
    try:
        files.update(
            plots.write_figures(
                study, out_dir, trial_dirs, objectives, timeline_trials=list(dict.fromkeys(shown))
            )
        )
    except Exception as exc:  # a report must never cost the study
        log.warning("could not draw the figures: %s", exc)
    _log_files(tracker, files.values())
    tags: dict[str, str] = {}
    if best is not None:
        yml = out_dir / f"best-{next(p for p in picks if p in best.picks)}.yaml"
        tags = {
            "tuner.recommended_trial": str(best.trial),
            "tuner.recommended_picks": ",".join(best.picks),
            "tuner.recommended_config": yml.name,
        }
        study.set_user_attr("recommended_trial", best.trial)
    if decided is not None:
        tags["tuner.verdict"] = decided.kind
        tags["tuner.verdict_metric"] = decided.metric
    try:
        if tags:
            tracker.set_tags(tags)
        if decided is not None:
            tracker.log_metrics(_verdict_metrics(decided))
    except Exception as exc:
        log.warning("could not tag the MLflow run: %s", exc)
    print_confirm(results, candidates, best, out_dir, console, picks, decided)
    return Published(files, best, tuple(results), decided)


def _log_files(tracker: Any, paths: Iterable[Path]) -> None:
    """Log the published files to the tracker's parent run. A figure goes as a self-contained
    copy (:func:`tuner.plots.self_contained`): MLflow's artifact view shows a page alone, where the
    ``plotly.min.js`` beside it in the run folder cannot load; so the bundle is not logged."""
    from tuner import plots

    if getattr(tracker, "parent_run_id", None) is None:  # tracking off: nothing to log
        return
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            if path.name == plots.PLOTLY_JS:
                continue
            try:
                alone = path.suffix == ".html"
                tracker.log_study_artifact(plots.self_contained(path, Path(tmp)) if alone else path)
            except Exception as exc:
                log.warning("could not log %s to MLflow: %s", path.name, exc)


def _verdict_metrics(v: Verdict) -> dict[str, float]:
    """``gain`` (the point) and ``gain_ci_low`` / ``gain_ci_high`` (the interval, where there is
    one) of the pick the verdict shows, as fractions."""
    g = v.gain
    if g is None or g.value is None:
        return {}
    out = {"gain": g.value}
    if g.low is not None and g.high is not None:
        out |= {"gain_ci_low": g.low, "gain_ci_high": g.high}
    return out


def _baseline_number(study: Any) -> int | None:
    t = baseline_trial(study)
    return None if t is None else int(t.number)


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
        for r in results:
            w = r.worst
            per_round = round_values(r, metric, higher)
            gain = decided.gains.get(r.trial) if decided is not None else None
            if decided is not None and r.trial == decided.baseline:
                vs = "(the reference)"
            else:
                vs = _gain_text(gain)
            if gain is not None and decided is not None and gain.claimed(decided.min_effect):
                vs += " ✓"
            n_held, n_rounds = _rounds_held(r)
            t.add_row(
                str(r.trial),
                ", ".join(r.picks),
                f"{n_held}/{n_rounds}" + ("" if r.passed else " DEMOTED"),
                " / ".join("—" if v is None else _fmt_value(metric, v) for v in per_round),
                vs,
                _fmt_metric("goodput", w.get("goodput")),
                _fmt_metric("output_throughput", w.get("output_throughput")),
                _fmt_metric("ttft_p95_ms", w.get("ttft_p95_ms")),
                _fmt_metric("tpot_p95_ms", w.get("tpot_p95_ms")),
                r.reason or "",
            )
        console.print(t)
    if decided is not None and results:
        console.print(line(decided))
    if best is None:
        if candidates:
            console.print("No pick held up under stress: nothing is recommended.")
        return
    name = next((p for p in picks if p in best.picks), next(iter(best.picks)))
    console.print(
        f"Recommended: trial {best.trial} ({', '.join(best.picks)}): "
        f"vllm serve --config {out_dir / f'best-{name}.yaml'}"
    )


def _fmt_value(name: str, v: float) -> str:
    """A value in a narrow column: no unit, a thousands separator."""
    return f"{v:,.0f}" if name.endswith("_ms") or abs(v) >= 1000 else f"{v:,.1f}"


def _trial_dirs_from_mlflow(study: Any, cfg: TunerConfig, dest: Path) -> dict[int, Path]:
    """Artifact folders of trials whose ``trial_dir`` is not on this machine (another worker's,
    or a deleted run dir), downloaded from their MLflow child runs."""
    missing = {t.number for t in study.trials if stored_trial.trial_dir(t) is None}
    if not missing or not cfg.tracking.enabled:
        return {}
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment or study.study_name)
    if exp is None:
        return {}
    out: dict[int, Path] = {}
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string="tags.`tuner.role` = 'trial'",
        order_by=["attributes.start_time DESC"],
        max_results=5000,
    )
    for run in runs:
        number = int(run.data.tags.get("trial.number", -1))
        if number not in missing or number in out:
            continue
        target = dest / f"trial_{number:04d}"
        target.mkdir(parents=True, exist_ok=True)
        try:
            client.download_artifacts(run.info.run_id, "", str(target))
        except Exception as exc:
            log.warning("could not download trial %d from MLflow: %s", number, exc)
            continue
        out[number] = target
    return out


def run_report(cfg: TunerConfig) -> Published:
    """``python -m tuner report study.name=NAME``: regenerate the exports, figures and tables of a
    stored study (SQLite or PostgreSQL storage, plus MLflow for trial folders on other machines)
    into this invocation's run dir, without running anything."""
    import optuna

    from tuner.engine.argv import mask, secret_values
    from tuner.errors import ConfigError
    from tuner.recovery import worker_id
    from tuner.storage import storage_url, study_name
    from tuner.stores import check_database, check_tracking, hide_url, quick_tracking_retries
    from tuner.tracking import WORKER, open_tracker

    storage = storage_url(cfg)
    shown = hide_url(storage)
    name = study_name(cfg)
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).is_file():
        raise ConfigError(f"no Optuna storage at {storage}; set study.storage or paths.state_dir")
    check_database(storage, "study.storage")  # one line, at once, when it is down
    if cfg.tracking.enabled:
        check_tracking(cfg.tracking.uri)
        quick_tracking_retries(cfg.tracking.uri)
    summaries = optuna.get_all_study_summaries(storage)
    if name not in {s.study_name for s in summaries}:
        have = ", ".join(sorted(s.study_name for s in summaries)) or "none"
        raise ConfigError(f"no study {name!r} in {shown}; stored studies: {have}")
    study = optuna.load_study(study_name=name, storage=storage)
    secrets = secret_values(cfg.engine, model=cfg.model)
    out_dir = Path(cfg.paths.output_dir)
    fetched = _trial_dirs_from_mlflow(study, cfg, out_dir / "trials")
    if fetched:
        log.info("downloaded %d trial folder(s) from MLflow", len(fetched))
    tracker = open_tracker(
        cfg.tracking.enabled,
        cfg.tracking.uri,
        cfg.tracking.experiment or name,
        f"report-{out_dir.name}",
        {"tuner.study": name, WORKER: worker_id()},
        lambda s: mask(s, secrets),
        role="report",
    )
    console = Console(width=160)
    status = "FAILED"
    try:
        console.print(
            f"Study {name}: {len(study.trials)} trials in {shown} "
            f"(workload {study.user_attrs.get('workload', '?')}, "
            f"model {study.user_attrs.get('model', '?')})"
        )
        print_pareto(study, cfg, console)
        published = publish(study, cfg, out_dir, tracker, console, trial_dirs=fetched)
        status = "FINISHED"
    finally:
        tracker.finish(status)
    console.print(f"Report written to {out_dir}: {', '.join(sorted(published.files))}")
    return published
