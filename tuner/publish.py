"""Publishing a study's results: ``pareto.json``, ``confirm.json``, the ``best-<pick>.yaml`` /
``.sh`` exports, the figures, the MLflow artifacts and tags of the parent run, and the confirm
table (:func:`publish`); for a lever screen (:mod:`tuner.screen`) its table, ``screen.json``
and figure instead of the picks and exports. It reads only storage and the trial folders, so
the study loop runs it after the search and ``python -m tuner report`` again from storage.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
from rich.console import Console

from tuner import screen, screen_report, stored_trial, study_card
from tuner.config import TunerConfig
from tuner.confirm import SEARCH_ONLY, current_verdict, recommended
from tuner.console import fmt_metric, gain_text, print_confirm
from tuner.export import ExportError, recommended_file, write_export
from tuner.quality_guard import describe, note
from tuner.records import Candidate, ConfirmResult
from tuner.stored_study import (
    ConfirmRecord,
    baseline_trial,
    pareto_rows,
    screen_levers,
    store_recommended,
)
from tuner.tracking import NullTracker, Tracker
from tuner.verdict import Verdict, line

log = logging.getLogger(__name__)

__all__ = ["Published", "publish"]


@dataclass(frozen=True)
class Published:
    """What :func:`publish` wrote and chose."""

    files: dict[str, Path]
    recommended: Candidate | None
    results: tuple[ConfirmResult, ...]
    verdict: Verdict | None = None


def _export_header(
    name: str,
    c: Candidate,
    confirmed: ConfirmResult | None,
    study: optuna.Study,
    stress: str,
    decided: Verdict | None = None,
    first: Sequence[str] = (),
) -> list[str]:
    """The comment lines of ``best-<name>.yaml``/``.sh``: the trial, its searched and confirmed
    metrics (the study's objectives ``first``: ``capacity_rps`` leads a capacity study's), the
    verdict, what changes numerics."""
    searched = {
        m: v for m, v in _first(c.search_metrics, first).items() if v == v and m not in SEARCH_ONLY
    }
    lines = [
        f"best-{name}: trial {c.trial} of tuner study {study.study_name!r}"
        + (" (vLLM defaults)" if c.baseline else ""),
        "searched: "
        + ", ".join(f"{m} {fmt_metric(m, v, c.search_metrics)}" for m, v in searched.items()),
    ]
    if confirmed is None:
        lines.append("not stress-tested (confirm.enabled=false)")
    elif confirmed.passed:
        worst = _first(confirmed.worst, first)
        lines.append(
            f"confirmed under {stress}: worst "
            + ", ".join(f"{m} {fmt_metric(m, v)}" for m, v in worst.items())
        )
    else:
        lines.append(f"DEMOTED under {stress}: {confirmed.reason}")
    if confirmed is not None and confirmed.quality and confirmed.passed:
        lines.append(describe(confirmed.quality))
    if decided is not None:
        gain = gain_text(decided.gains.get(c.trial), decided.metric)
        if gain:
            lines.append(f"vs vLLM's defaults, re-measured in the same rounds: {gain}")
        if decided.recommended == c.trial:
            lines.append(f"recommended ({line(decided).removeprefix('Verdict: ')})")
    numerics = stored_trial.changes_numerics(study.trials[c.trial])
    if numerics and not (confirmed is not None and confirmed.quality):  # the guard's line said it
        lines.append(
            f"changes numerics ({', '.join(numerics)}): check its output quality (docs/quality.md)"
        )
    lines.append(f"use: vllm serve --config best-{name}.yaml")
    return [x.translate(_ASCII) for x in lines]


def _first(metrics: Mapping[str, float], names: Sequence[str]) -> dict[str, float]:
    """``metrics`` with ``names`` (those it has) moved to the front, in their order."""
    head = {m: metrics[m] for m in names if m in metrics}
    return {**head, **{m: v for m, v in metrics.items() if m not in head}}


_ASCII = str.maketrans({"\u2212": "-", "\u2026": "...", "\u2014": "-", "\u2192": "->"})
"""The export headers stay ASCII: whatever reads ``best-*.yaml`` and ``.sh``, in any locale."""


def publish(
    study: optuna.Study,
    cfg: TunerConfig,
    out_dir: Path,
    tracker: Tracker | NullTracker,
    console: Console | None = None,
    trial_dirs: Mapping[int, Path] | None = None,
) -> Published:
    """Write pareto.json, ``best-<pick>.yaml``/``.sh`` and the figures to ``out_dir``, log them to
    the tracker's parent run, tag it with the recommended trial, and print the verdicts. Reads only
    storage and the trial folders (``trial_dirs`` adds or replaces some), so a finished study can
    be re-published."""
    from tuner import plots  # plotly and pandas: 2-3 s to import, only when a report is written

    console = console or Console(width=160)
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    table = out_dir / "pareto.json"
    table.write_text(json.dumps(pareto_rows(study, cfg), indent=2, default=str) + "\n")
    files["pareto.json"] = table

    now = current_verdict(study, cfg)
    candidates, results, decided = now.candidates, now.results, now.verdict
    levers = screen.rows(study, cfg) if screen_levers(study) is not None else None
    if levers is not None:  # a lever screen picks and exports nothing: its table is the result
        candidates, results, decided = (), (), None
        files["screen.json"] = screen_report.write_json(levers, out_dir)
    stress = "" if now.record is None else _stress(now.record)
    verdicts = {r.trial: r for r in results}
    picks = [p for p in cfg.confirm.picks if any(p in c.picks for c in candidates)]
    leads = [o.metric for o in cfg.objective.objectives]
    for c in candidates:
        picks += [p for p in c.picks if p not in picks]
    for name in picks:
        c = next(c for c in candidates if name in c.picks)
        if not c.serve_args:
            log.warning("trial %d has no recorded command line; best-%s not written", c.trial, name)
            continue
        header = _export_header(name, c, verdicts.get(c.trial), study, stress, decided, first=leads)
        try:
            yml, sh = write_export(
                out_dir, name, c.serve_args, drop=cfg.confirm.export_drop, header=header
            )
        except ExportError as exc:
            log.warning("best-%s not written: %s", name, exc)
            continue
        files[yml.name] = yml
        files[sh.name] = sh
    if results and now.record is not None:  # results come from the stored record only
        path = out_dir / "confirm.json"
        path.write_text(json.dumps(now.record.as_dict(), indent=2, default=str) + "\n")
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
    base = baseline_trial(study, which="feasible")
    baseline_number = None if base is None else base.number
    shown = [n for n in (best.trial if best else None, baseline_number) if n is not None]
    card = study_card.publish_card(study, cfg, out_dir, trial_dirs, candidates, results, files)
    try:
        files.update(
            plots.write_figures(
                study,
                out_dir,
                trial_dirs,
                objectives,
                timeline_trials=list(dict.fromkeys(shown)),
                card=None if card is None else card.as_dict(),
                screen=None if levers is None else [r.as_dict() for r in levers],
            )
        )
    except Exception as exc:  # a report must never cost the study
        log.warning("could not draw the figures: %s", exc)
    _log_files(tracker, files.values())
    tags: dict[str, str] = {}
    if best is not None:
        yml = out_dir / recommended_file(best.picks, picks)
        tags = {
            "tuner.recommended_trial": str(best.trial),
            "tuner.recommended_picks": ",".join(best.picks),
            "tuner.recommended_config": yml.name,
        }
        store_recommended(study, best.trial)
    if decided is not None:
        tags["tuner.verdict"] = decided.kind
        tags["tuner.verdict_metric"] = decided.metric
    tags |= _quality_tags(results)
    try:
        if tags:
            tracker.set_tags(tags)
        if decided is not None:
            tracker.log_metrics(_verdict_metrics(decided))
        if quality := _quality_metrics(results):
            tracker.log_metrics(quality)
        if card is not None:
            tracker.log_metrics(card.metrics())
        if levers is not None:
            tracker.log_metrics(screen_report.metrics(levers))
    except Exception as exc:
        log.warning("could not tag the MLflow run: %s", exc)
    print_confirm(results, candidates, best, out_dir, console, picks, decided)
    if card is not None:
        study_card.print_card(card, console)
    if levers is not None:
        screen_report.print_table(levers, console)
        if cfg.engine.kind == "sim":
            note = screen_report.simulated_note(cfg.workload.images is not None)
            console.print(note, markup=False)
        more = screen_report.follow_up(levers)
        if more:
            only = ",".join(more)
            console.print(
                f"follow up (a change of {cfg.screen.follow_up:.0%} or more on fewer than 3 "
                f"servers): the same command with screen.servers=3 'screen.only=[{only}]'",
                markup=False,
            )
    return Published(files, best, tuple(results), decided)


def _stress(record: ConfirmRecord) -> str:
    """``2x load, 3x duration, seeds [1, 2], 2 rounds on fresh servers``: the export headers."""
    n = record.rounds
    return (
        f"{record.load_factor:g}x load, {record.duration_factor:g}x duration, "
        f"seeds {list(record.seeds)}, {n} round{'s' if n != 1 else ''} on fresh servers"
    )


def _log_files(tracker: Tracker | NullTracker, paths: Iterable[Path]) -> None:
    """Log the published files to the tracker's parent run. A figure goes as a self-contained
    copy (:func:`tuner.plots.self_contained`): MLflow's artifact view shows a page alone, where the
    ``plotly.min.js`` beside it in the run folder cannot load; so the bundle is not logged."""
    from tuner import plots  # see publish

    if tracker.parent_run_id is None:  # tracking off: nothing to log
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


def _quality_tags(results: Iterable[ConfirmResult]) -> dict[str, str]:
    """``tuner.quality``: the quality guard's line (:func:`tuner.quality_guard.note`), and
    ``tuner.quality_demoted``: the trials it demoted (``quality`` among their reasons)."""
    results = list(results)
    said = note(results)
    if said is None:
        return {}
    demoted = [
        str(r.trial)
        for r in results
        if r.quality and r.quality.get("status") in ("measured", "unmeasured")
        and not r.quality.get("passed")
    ]  # fmt: skip
    return {"tuner.quality": said[:5000], "tuner.quality_demoted": ",".join(demoted) or "none"}


def _quality_metrics(results: Iterable[ConfirmResult]) -> dict[str, float]:
    """``quality_agreement.trial_N``: each guarded pick's worst-round agreement with vLLM's
    defaults on ``confirm.quality.measure``."""
    return {
        f"quality_agreement.trial_{r.trial}": float(r.quality["agreement"])
        for r in results
        if r.quality and r.quality.get("agreement") is not None
    }
