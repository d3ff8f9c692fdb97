"""Figures of a study and of its trials, data separate from drawing.

Each figure has a pure data function that returns a :class:`pandas.DataFrame` (tested without
plotly) and a drawing function that takes that frame and returns a
:class:`plotly.graph_objects.Figure`:

- :func:`trial_points` (and :func:`pareto_step`) → :func:`pareto_figure`
- :func:`latency_cdf_data` → :func:`latency_cdf_figure`
- :func:`timeline_data` → :func:`timeline_figure`
- Optuna's own plots, on the measured trials: :func:`parallel_coordinates_figure`,
  :func:`importance_figure`

:func:`write_figures` writes them all as HTML (plotly.js from the CDN) with each frame as CSV
beside its figure; a figure that fails is logged and skipped.

A trial the tuner could not measure (``failure_reason`` user attr) is told to Optuna as COMPLETE
with penalty values and a violated ``failed_<reason>`` constraint: its values are *not*
measurements, so they are NaN here and such trials are counted, never plotted as points.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from tuner import stored_trial
from tuner.records import RequestRecord

__all__ = [
    "CDF_QUANTILES",
    "LATENCY_METRICS",
    "PARAM_PREFIX",
    "STATUSES",
    "importance_figure",
    "latency_cdf_data",
    "latency_cdf_figure",
    "parallel_coordinates_figure",
    "pareto_figure",
    "pareto_step",
    "timeline_data",
    "timeline_figure",
    "trial_points",
    "write_figures",
]

log = logging.getLogger("tuner")

STATUSES: tuple[str, ...] = ("pareto", "feasible", "infeasible", "failed", "pruned", "running")
"""The values of ``trial_points(...)["status"]``."""

PARAM_PREFIX = "params_"
"""Param columns of :func:`trial_points` are ``params_<name>`` (as Optuna's trials_dataframe)."""

LATENCY_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")
"""The metrics :func:`latency_cdf_data` can read from ``requests.jsonl``."""

CDF_QUANTILES: tuple[float, ...] = tuple(sorted({i / 100 for i in range(101)} | {0.995, 0.999}))
"""The quantiles at which :func:`latency_cdf_data` evaluates each distribution (0 … 1)."""

Objectives = Sequence[tuple[str, str]]


# --- trial points and the Pareto figure -------------------------------------------------------


def _metric_names(study: optuna.Study) -> list[str]:
    return list(study.metric_names or [f"value_{i}" for i in range(len(study.directions))])


def _status(t: optuna.trial.FrozenTrial, best: set[int]) -> str:
    state = t.state
    if state == optuna.trial.TrialState.PRUNED:
        return "pruned"
    if state in (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING):
        return "running"
    if state == optuna.trial.TrialState.FAIL or stored_trial.failure_reason(t):
        return "failed"
    if t.number in best:
        return "pareto"
    if any(v > 0 for v in t.constraints.values()):
        return "infeasible"
    return "feasible"


def trial_points(study: optuna.Study) -> pd.DataFrame:
    """One row per trial of ``study``.

    Columns: ``number``, ``state`` (Optuna's state name), one column per objective named as
    ``study.metric_names`` (``value_<i>`` if the study has none), ``status`` (one of
    :data:`STATUSES`), ``baseline`` (the ``baseline`` user attr), ``failure_reason`` and
    ``violated`` (comma-separated names of the constraints > 0), both missing (NaN) when there
    is none, and ``params_<name>`` for every param.

    ``status``: *pruned* and *running* (RUNNING or WAITING) follow the state; *failed* is a
    trial with a ``failure_reason`` user attr (COMPLETE with penalty values) or in state FAIL
    (interrupted, or a tuner bug: reason ``tuner_error``/``interrupted``); *pareto* is a trial
    of ``study.best_trials`` (which honours the constraints); *infeasible* is COMPLETE with a
    constraint > 0; the rest is *feasible*. Objectives are NaN unless the status is pareto,
    feasible or infeasible.
    """
    names = _metric_names(study)
    best = {t.number for t in study.best_trials}
    rows: list[dict[str, Any]] = []
    for t in study.get_trials(deepcopy=False):
        status = _status(t, best)
        reason = stored_trial.failure_reason(t)
        if status == "failed" and not reason:
            reason = "tuner_error" if stored_trial.tuner_error(t) else "interrupted"
        measured = status in ("pareto", "feasible", "infeasible") and t.values is not None
        values = list(t.values) if measured and t.values is not None else []
        violated = sorted(k for k, v in t.constraints.items() if v > 0)
        row: dict[str, Any] = {"number": t.number, "state": t.state.name}
        for i, name in enumerate(names):
            row[name] = float(values[i]) if i < len(values) else math.nan
        row["status"] = status
        row["baseline"] = stored_trial.is_baseline(t)
        row["failure_reason"] = reason or None
        row["violated"] = ",".join(violated) or None
        for k, v in t.params.items():
            row[PARAM_PREFIX + k] = v
        rows.append(row)
    columns = ["number", "state", *names, "status", "baseline", "failure_reason", "violated"]
    frame = pd.DataFrame(rows, columns=None if rows else columns)
    return frame.sort_values("number", ignore_index=True) if rows else frame


def _signs(objectives: Objectives) -> list[float]:
    signs = []
    for name, direction in objectives:
        if direction not in ("maximize", "minimize"):
            raise ValueError(
                f"objective {name!r}: direction {direction!r} is not maximize|minimize"
            )
        signs.append(-1.0 if direction == "maximize" else 1.0)
    return signs


def pareto_step(points: pd.DataFrame, objectives: Objectives) -> pd.DataFrame:
    """The Pareto front of the first two objectives as a staircase: the ``pareto`` points of
    :func:`trial_points` with the corners between them, in drawing order.

    The staircase is the boundary of the region the front dominates: between two neighbouring
    points it keeps the worse point's level on the second objective until it reaches the next
    point's first objective. Columns: the two metric names and ``number`` (None at corners).
    """
    if len(objectives) < 2:
        raise ValueError("pareto_step needs two objectives")
    (mx, _), (my, _) = objectives[0], objectives[1]
    sx, sy = _signs(objectives[:2])
    front = points[points["status"] == "pareto"].dropna(subset=[mx, my])
    # in "minimise both" coordinates the front sorted by x has y descending
    pts = sorted(
        (sx * float(x), sy * float(y), int(n))
        for x, y, n in zip(front[mx], front[my], front["number"], strict=True)
    )
    rows: list[dict[str, Any]] = []
    for i, (u, v, n) in enumerate(pts):
        if i:
            rows.append({mx: sx * u, my: sy * pts[i - 1][1], "number": None})
        rows.append({mx: sx * u, my: sy * v, "number": n})
    return pd.DataFrame(rows, columns=[mx, my, "number"])


_STATUS_STYLE: dict[str, dict[str, Any]] = {
    "infeasible": {
        "label": "infeasible (constraint violated)",
        "marker": {"symbol": "x", "size": 8, "color": "#9e9e9e"},
    },
    "feasible": {
        "label": "feasible",
        "marker": {"symbol": "circle", "size": 9, "color": "#4c78a8", "opacity": 0.85},
    },
    "pareto": {
        "label": "Pareto front",
        "marker": {
            "symbol": "diamond",
            "size": 13,
            "color": "#e45756",
            "line": {"width": 1, "color": "#7a1f1e"},
        },
    },
}
_LEGEND_RANK = {"pareto": 1, "feasible": 2, "infeasible": 3, "baseline": 4}
_BASELINE_MARKER = {
    "symbol": "star",
    "size": 24,
    "color": "#f2c12e",
    "line": {"width": 1.5, "color": "#333"},
}


def _fmt(v: Any) -> str:
    if isinstance(v, float | np.floating):
        return f"{float(v):,.4g}" if math.isfinite(v) else "-"
    return str(v)


def _hover(row: pd.Series, metrics: Sequence[str]) -> str:
    head = f"<b>trial {int(row['number'])}</b> ({row['status']})"
    if row.get("baseline"):
        head += " — vLLM defaults"
    lines = [head]
    lines += [f"{m}: {_fmt(row[m])}" for m in metrics if m in row.index]
    if isinstance(row.get("violated"), str):
        lines.append(f"violated: {row['violated']}")
    params = [
        f"{k[len(PARAM_PREFIX) :]}={_fmt(v)}"
        for k, v in row.items()
        if str(k).startswith(PARAM_PREFIX) and not (isinstance(v, float) and math.isnan(v))
    ]
    return "<br>".join(lines + params)


def _unplotted_note(points: pd.DataFrame) -> str:
    """'failed: 2 (invalid_config ×1, cuda_oom ×1) · pruned: 1', or '' when all are plotted."""
    parts = []
    failed = points[points["status"] == "failed"]
    if len(failed):
        reasons = Counter(str(r) for r in failed["failure_reason"].fillna("unknown"))
        listed = ", ".join(f"{r} ×{c}" for r, c in reasons.most_common())
        parts.append(f"failed (no measurement): {len(failed)} ({listed})")
    for status in ("pruned", "running"):
        n = int((points["status"] == status).sum())
        if n:
            parts.append(f"{status}: {n}")
    base = points[points["baseline"].astype(bool) & ~points["status"].isin(list(_STATUS_STYLE))]
    for _, row in base.iterrows():
        why = f": {row['failure_reason']}" if isinstance(row["failure_reason"], str) else ""
        parts.append(f"baseline (vLLM defaults) {row['status']}{why}")
    return " · ".join(parts)


def _axis_title(name: str, direction: str) -> str:
    return f"{name} ({'higher' if direction == 'maximize' else 'lower'} is better)"


def pareto_figure(points: pd.DataFrame, objectives: Objectives) -> go.Figure:
    """The trials of :func:`trial_points` on the first two objectives.

    A trace per status (``legendgroup`` = the status: infeasible, feasible, pareto), the Pareto
    front joined as a staircase (:func:`pareto_step`), the baseline as a big star annotated
    "vLLM defaults" (legendgroup ``baseline``), and the trials without values (failed with their
    reasons, pruned, running) counted in the title. Hover: trial number, values and params. With
    a single objective, the objective against the trial number with the best-so-far line.
    """
    if not objectives:
        raise ValueError("pareto_figure needs at least one objective")
    _signs(objectives)
    metrics = [m for m, _ in objectives]
    missing = [m for m in metrics if m not in points.columns]
    if missing:
        raise ValueError(f"objectives {missing} are not columns of the trial points")
    single = len(objectives) == 1
    xcol, ycol = ("number", metrics[0]) if single else (metrics[0], metrics[1])
    fig = go.Figure()
    if not single:
        step = pareto_step(points, objectives)
        if len(step) > 1:
            fig.add_trace(
                go.Scatter(
                    x=step[xcol],
                    y=step[ycol],
                    mode="lines",
                    line={"color": "#e45756", "width": 2, "dash": "dot"},
                    name="Pareto front",
                    legendgroup="pareto",
                    showlegend=False,
                    hoverinfo="skip",
                )
            )
    else:
        fig.add_traces(_best_so_far(points, objectives[0]))
    base = points[points["baseline"].astype(bool)].dropna(subset=[xcol, ycol])
    if not base.empty:  # under the status markers: a Pareto baseline shows both
        fig.add_trace(
            go.Scatter(
                x=base[xcol],
                y=base[ycol],
                mode="markers",
                marker=_BASELINE_MARKER,
                name="baseline (vLLM defaults)",
                legendgroup="baseline",
                legendrank=_LEGEND_RANK["baseline"],
                customdata=base["number"],
                hovertext=[_hover(r, metrics) for _, r in base.iterrows()],
                hoverinfo="text",
            )
        )
    for status, style in _STATUS_STYLE.items():
        sub = points[(points["status"] == status)].dropna(subset=[xcol, ycol])
        if sub.empty:
            continue
        fig.add_trace(
            go.Scatter(
                x=sub[xcol],
                y=sub[ycol],
                mode="markers",
                marker=style["marker"],
                name=f"{style['label']} ({len(sub)})",
                legendgroup=status,
                legendrank=_LEGEND_RANK[status],
                customdata=sub["number"],
                hovertext=[_hover(r, metrics) for _, r in sub.iterrows()],
                hoverinfo="text",
            )
        )
    for x, y in zip(base[xcol], base[ycol], strict=True):
        fig.add_annotation(
            x=x,
            y=y,
            text="vLLM defaults",
            showarrow=True,
            arrowhead=2,
            ax=45,
            ay=-40,
            font={"size": 13},
            bgcolor="rgba(255,255,255,0.8)",
        )
    n_plotted = int(points["status"].isin(list(_STATUS_STYLE)).sum())
    title = f"Trials on {metrics[0]}" + ("" if single else f" × {metrics[1]}")
    title += f" — {n_plotted} measured of {len(points)}"
    if len(objectives) > 2:
        title += f" (first 2 of {len(objectives)} objectives)"
    note = _unplotted_note(points)
    if note:
        title += f"<br><sup>{note}</sup>"
    if not n_plotted:
        _center_note(fig, "no measured trial yet", 16)
    fig.update_layout(
        title={"text": title},
        xaxis_title="trial" if single else _axis_title(*objectives[0]),
        yaxis_title=_axis_title(*objectives[0] if single else objectives[1]),
        template="plotly_white",
        hoverlabel={"align": "left"},
        legend={"orientation": "h", "yanchor": "top", "y": -0.15, "xanchor": "center", "x": 0.5},
        margin={"t": 90},
    )
    return fig


def _best_so_far(points: pd.DataFrame, objective: tuple[str, str]) -> list[go.Scatter]:
    name, direction = objective
    ok = points[points["status"].isin(["pareto", "feasible"])].dropna(subset=[name])
    ok = ok.sort_values("number")
    if ok.empty:
        return []
    values = ok[name].to_numpy(dtype=float)
    best = (
        np.maximum.accumulate(values) if direction == "maximize" else np.minimum.accumulate(values)
    )
    return [
        go.Scatter(
            x=ok["number"],
            y=best,
            mode="lines",
            line={"shape": "hv", "color": "#e45756", "width": 2, "dash": "dot"},
            name="best feasible so far",
            legendgroup="pareto",
            hoverinfo="skip",
        )
    ]


# --- Optuna's own figures on the measured trials --------------------------------------------


def _center_note(fig: go.Figure, text: str, size: int) -> None:
    fig.add_annotation(
        text=text, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False, font={"size": size}
    )


def _message_figure(title: str, text: str) -> go.Figure:
    fig = go.Figure()
    _center_note(fig, text, 15)
    fig.update_layout(
        title={"text": title},
        xaxis={"visible": False},
        yaxis={"visible": False},
        template="plotly_white",
    )
    return fig


def _panel_centre(fig: go.Figure, row: int, col: int) -> dict[str, Any]:
    """Paper coordinates of a subplot's centre (in Chromium, an "x domain" reference to the
    axes of a subplot without traces was drawn in another panel)."""
    sub = fig.get_subplot(row, col)
    x0, x1 = sub.xaxis.domain
    y0, y1 = sub.yaxis.domain
    return {"xref": "paper", "yref": "paper", "x": (x0 + x1) / 2, "y": (y0 + y1) / 2}


def _measured(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """COMPLETE trials with real values (not the penalty values of a failed trial)."""
    return [t for t in study.get_trials(deepcopy=False) if stored_trial.measured(t)]


def _measured_study(study: optuna.Study) -> optuna.Study:
    """An in-memory copy of ``study`` holding only its measured trials (Optuna's plots take a
    study, and a failed trial's penalty values would swamp them)."""
    storage = optuna.storages.InMemoryStorage()
    name = f"{study.study_name}-measured"
    quiet = logging.getLogger("optuna.storages._in_memory")  # "A new study created in memory"
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        storage.create_new_study(study.directions, study_name=name)
    finally:
        quiet.setLevel(level)
    copy = optuna.Study(name, storage, sampler=optuna.samplers.RandomSampler(seed=0))
    copy.add_trials(_measured(study))
    return copy


def _value_target(i: int) -> Callable[[optuna.trial.FrozenTrial], float]:
    def target(t: optuna.trial.FrozenTrial) -> float:
        return float(t.values[i])

    return target


def parallel_coordinates_figure(study: optuna.Study, objective_index: int = 0) -> go.Figure:
    """Optuna's parallel-coordinate plot of the measured trials (failed ones left out), coloured
    by objective ``objective_index``; an annotated empty figure when none was measured."""
    names = _metric_names(study)
    if not 0 <= objective_index < len(names):
        raise ValueError(f"objective_index {objective_index} not in 0..{len(names) - 1}")
    name = names[objective_index]
    title = f"Parallel coordinates — {name}"
    measured = _measured(study)
    if not measured:
        return _message_figure(title, "no measured trial yet (every trial failed or is running)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        fig = optuna.visualization.plot_parallel_coordinate(
            _measured_study(study), target=_value_target(objective_index), target_name=name
        )
    fig.update_layout(title={"text": f"{title} ({len(measured)} measured trials)"})
    return fig


def importance_figure(study: optuna.Study) -> go.Figure:
    """Optuna's param importances (its default evaluator) for each objective, one panel each,
    over the measured trials (failed ones left out). With fewer than 2 measured trials, or if
    Optuna cannot evaluate an objective, the figure (or panel) says so instead of raising."""
    names = _metric_names(study)
    measured = _measured(study)
    title = f"Param importances ({len(measured)} measured trials)"
    if len(measured) < 2:
        return _message_figure(
            title, f"{len(measured)} measured trial(s): importances need at least 2"
        )
    copy = _measured_study(study)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, horizontal_spacing=0.15)
    errors = 0
    for i, name in enumerate(names):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sub = optuna.visualization.plot_param_importances(
                    copy, target=_value_target(i), target_name=name
                )
            if not sub.data:
                raise ValueError("no importances")
        except Exception as exc:  # too few distinct values, no params, ...
            errors += 1
            log.debug("importance of %s failed: %s", name, exc)
            fig.add_annotation(
                text=f"cannot evaluate:<br>{type(exc).__name__}: {str(exc)[:80]}",
                **_panel_centre(fig, 1, i + 1),
                showarrow=False,
            )
            continue
        for trace in sub.data:
            trace.showlegend = False
            fig.add_trace(trace, row=1, col=i + 1)
        fig.update_xaxes(title_text="importance", row=1, col=i + 1)
    if errors == len(names):
        return _message_figure(title, "Optuna could not evaluate the importances (see the log)")
    fig.update_layout(
        title={"text": title}, template="plotly_white", height=max(400, 40 * _n_params(study))
    )
    return fig


def _n_params(study: optuna.Study) -> int:
    return len({k for t in study.get_trials(deepcopy=False) for k in t.params})


# --- latency distributions --------------------------------------------------------------------


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a ``.jsonl`` file; a torn line (killed writer) is skipped."""
    with path.open() as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                log.debug("skipping a torn line in %s", path)
                continue
            if isinstance(row, dict):
                yield row


def _latencies_ms(rows: Sequence[Mapping[str, Any]], metric: str) -> np.ndarray:
    out: list[float] = []
    for row in rows:
        if metric == "ttft_ms":
            v = row.get("ttft_s")
            vals = [v] if v is not None else []
        elif metric == "e2e_ms":
            v = row.get("e2e_s")
            vals = [v] if v is not None else []
        elif metric == "tpot_ms":
            rec = RequestRecord(
                index=int(row.get("index", 0)),
                status="ok",
                t_sent_s=0.0,
                ttft_s=row.get("ttft_s"),
                e2e_s=row.get("e2e_s"),
                output_tokens=row.get("output_tokens"),
            )
            vals = [rec.tpot_s] if rec.tpot_s is not None else []
        else:  # itl_ms
            vals = list(row.get("itl_s") or [])
        out += [float(x) * 1000.0 for x in vals]
    arr = np.asarray(out, dtype=float)
    return arr[np.isfinite(arr)]


def latency_cdf_data(
    trial_dirs: Mapping[int, Path], metrics: Sequence[str] = ("ttft_ms", "tpot_ms", "e2e_ms")
) -> pd.DataFrame:
    """Latency distributions of the measured requests (not warm-up, status ``ok``) of each
    trial's ``requests.jsonl``, as quantiles.

    Long format, one row per trial, metric and quantile of :data:`CDF_QUANTILES`: ``trial``,
    ``metric``, ``value_ms`` (``numpy.quantile``, linear interpolation: the row of quantile 0.5
    is the median), ``quantile`` (0 … 1, ascending) and ``n`` (samples). ``metrics`` are among
    :data:`LATENCY_METRICS` (``tpot`` as :attr:`RequestRecord.tpot_s`; ``itl`` pools every
    inter-token gap). A trial without the file or without samples of a metric has no rows.
    """
    unknown = [m for m in metrics if m not in LATENCY_METRICS]
    if unknown:
        raise ValueError(f"unknown latency metrics {unknown}; known: {list(LATENCY_METRICS)}")
    qs = np.asarray(CDF_QUANTILES, dtype=float)
    frames: list[pd.DataFrame] = []
    for number in sorted(trial_dirs):
        path = Path(trial_dirs[number]) / "requests.jsonl"
        if not path.is_file():
            log.debug("trial %d: no %s", number, path)
            continue
        rows = [r for r in _jsonl(path) if r.get("status") == "ok" and not r.get("warmup")]
        for metric in metrics:
            values = _latencies_ms(rows, metric)
            if values.size == 0:
                continue
            frames.append(
                pd.DataFrame(
                    {
                        "trial": number,
                        "metric": metric,
                        "value_ms": np.quantile(values, qs),
                        "quantile": qs,
                        "n": int(values.size),
                    }
                )
            )
    columns = ["trial", "metric", "value_ms", "quantile", "n"]
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True)[columns]


_METRIC_TITLES = {
    "ttft_ms": "time to first token (ms)",
    "tpot_ms": "time per output token (ms)",
    "e2e_ms": "end-to-end latency (ms)",
    "itl_ms": "inter-token latency (ms)",
}


def _palette(n: int) -> list[str]:
    colors = list(qualitative.Plotly) if n <= 10 else list(qualitative.Dark24)
    return [colors[i % len(colors)] for i in range(n)]


def latency_cdf_figure(
    frame: pd.DataFrame,
    *,
    labels: Mapping[int, str] | None = None,
    highlight: Sequence[int] | None = None,
) -> go.Figure:
    """The CDFs of :func:`latency_cdf_data`: a panel per metric, a line per trial (one colour
    and legend entry per trial across panels), dotted guides at p50/p95/p99.

    ``labels`` names trials in the legend (default ``trial <n>``); with ``highlight``, the
    other trials start hidden (``legendonly``: a click on the legend shows them).
    """
    if frame.empty:
        return _message_figure("Latency CDFs", "no measured requests in these trials")
    metrics = list(dict.fromkeys(frame["metric"]))
    trials = sorted(int(t) for t in frame["trial"].unique())
    colors = dict(zip(trials, _palette(len(trials)), strict=True))
    shown = set(highlight) if highlight is not None else set(trials)
    fig = make_subplots(
        rows=1,
        cols=len(metrics),
        subplot_titles=[_METRIC_TITLES.get(m, m) for m in metrics],
        horizontal_spacing=0.06,
    )
    for col, metric in enumerate(metrics, start=1):
        for trial in trials:
            sub = frame[(frame["metric"] == metric) & (frame["trial"] == trial)]
            if sub.empty:
                continue
            sub = sub.sort_values("quantile")
            name = (labels or {}).get(trial, f"trial {trial}")
            fig.add_trace(
                go.Scatter(
                    x=sub["value_ms"],
                    y=sub["quantile"],
                    mode="lines",
                    line={"color": colors[trial], "width": 2},
                    name=name,
                    legendgroup=f"trial {trial}",
                    showlegend=col == 1,
                    visible=True if trial in shown else "legendonly",
                    hovertemplate=(
                        f"{name}<br>p%{{y:.1%}}: %{{x:,.1f}} ms<br>n={int(sub['n'].iloc[0])}"
                        "<extra></extra>"
                    ),
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="ms", row=1, col=col)
    for q in (0.5, 0.95, 0.99):
        fig.add_hline(y=q, line={"dash": "dot", "width": 1, "color": "#bbb"}, row="all", col="all")
    fig.update_yaxes(title_text="share of requests ≤ x", row=1, col=1)
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    fig.update_layout(
        title={"text": "Latency CDFs of the measured requests"},
        template="plotly_white",
        height=450,
    )
    return fig


# --- telemetry timeline -----------------------------------------------------------------------

_GPU_FIELDS = (
    ("mem_used_gib", "gpu_memory", "GPU {gpu} memory used (GiB)", 1.0),
    ("util_pct", "gpu_util", "GPU {gpu} utilisation (%)", 1.0),
    ("power_w", "gpu_power", "GPU {gpu} power (W)", 1.0),
)
_PROM_FIELDS = (
    ("vllm:kv_cache_usage_perc", "kv_cache", "KV cache usage (%)", 100.0),  # vLLM: 0..1
    ("vllm:num_requests_running", "requests", "running requests", 1.0),
    ("vllm:num_requests_waiting", "requests", "waiting requests", 1.0),
)
_PANELS = {
    "gpu_memory": "GPU memory used (GiB)",
    "gpu_util": "GPU utilisation (%)",
    "gpu_power": "GPU power (W)",
    "kv_cache": "KV cache usage (%)",
    "requests": "requests running / waiting",
}
_CORE_PANELS = ("gpu_memory", "kv_cache", "requests")


def timeline_data(trial_dir: Path) -> pd.DataFrame:
    """The telemetry of one trial over the replay, long format: ``t_s``, ``series``, ``value``
    and ``panel`` (the subplot of :func:`timeline_figure`).

    From ``gpu.jsonl`` (:class:`~tuner.telemetry.gpu.GpuSampler` rows): per GPU, memory used
    (GiB), utilisation (%) and power (W); from ``metrics.jsonl``
    (:class:`~tuner.telemetry.prom.MetricsScraper` rows): KV cache usage in % (vLLM reports
    0..1), running and waiting requests. Both clocks start when the replay's telemetry starts.
    Missing files give no rows.
    """
    rows: list[tuple[float, str, float, str]] = []
    trial_dir = Path(trial_dir)
    gpu_path = trial_dir / "gpu.jsonl"
    if gpu_path.is_file():
        for r in _jsonl(gpu_path):
            if "t_s" not in r:
                continue
            gpu = int(r.get("gpu", 0))
            for key, panel, series, scale in _GPU_FIELDS:
                if r.get(key) is not None:
                    rows.append(
                        (float(r["t_s"]), series.format(gpu=gpu), float(r[key]) * scale, panel)
                    )
    prom_path = trial_dir / "metrics.jsonl"
    if prom_path.is_file():
        for r in _jsonl(prom_path):
            if "t_s" not in r:
                continue
            for key, panel, series, scale in _PROM_FIELDS:
                if r.get(key) is not None:
                    rows.append((float(r["t_s"]), series, float(r[key]) * scale, panel))
    frame = pd.DataFrame(rows, columns=["t_s", "series", "value", "panel"])
    return frame.sort_values(["panel", "series", "t_s"], ignore_index=True, kind="stable")


def _colour_key(series: str) -> str:
    """A series' colour: its GPU's ("GPU 1 power (W)" → "GPU 1"), else its own."""
    words = series.split()
    return " ".join(words[:2]) if words[:1] == ["GPU"] else series


def timeline_figure(frame: pd.DataFrame, title: str) -> go.Figure:
    """The frame of :func:`timeline_data` as stacked panels sharing the time axis: GPU memory,
    KV cache usage and running/waiting requests always (an empty one says "no samples"), GPU
    utilisation and power when sampled. An empty frame gives an annotated empty figure."""
    if frame.empty:
        return _message_figure(title, "no telemetry samples for this trial")
    present = set(frame["panel"])
    panels = [p for p in _PANELS if p in present or p in _CORE_PANELS]
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=[_PANELS[p] for p in panels],
    )
    keys = list(dict.fromkeys(_colour_key(x) for x in frame["series"]))  # a GPU: one colour
    colors = dict(zip(keys, _palette(len(keys)), strict=True))
    for row, panel in enumerate(panels, start=1):
        sub = frame[frame["panel"] == panel]
        if sub.empty:
            why = " (NVML unavailable?)" if panel.startswith("gpu") else ""
            fig.add_annotation(
                text=f"no samples{why}",
                **_panel_centre(fig, row, 1),
                showarrow=False,
                font={"color": "#888"},
            )
            continue
        for series in dict.fromkeys(sub["series"]):
            s = sub[sub["series"] == series].sort_values("t_s")
            fig.add_trace(
                go.Scatter(
                    x=s["t_s"],
                    y=s["value"],
                    mode="lines+markers" if len(s) < 30 else "lines",
                    marker={"size": 4},
                    line={"color": colors[_colour_key(series)]},
                    name=series,
                    hovertemplate=f"{series}<br>t=%{{x:.1f}} s: %{{y:,.2f}}<extra></extra>",
                ),
                row=row,
                col=1,
            )
    fig.update_xaxes(title_text="seconds since the replay started", row=len(panels), col=1)
    fig.update_layout(
        title={"text": title}, template="plotly_white", height=230 * len(panels) + 120
    )
    return fig


# --- writing ----------------------------------------------------------------------------------


def _write_html(path: Path, figures: Sequence[go.Figure]) -> None:
    """One figure as ``write_html``; several in one page (plotly.js loaded once, from the CDN)."""
    if len(figures) == 1:
        figures[0].write_html(str(path), include_plotlyjs="cdn")
        return
    parts = [
        fig.to_html(full_html=False, include_plotlyjs="cdn" if i == 0 else False)
        for i, fig in enumerate(figures)
    ]
    body = "\n".join(parts)
    path.write_text(
        f'<html>\n<head><meta charset="utf-8" /></head>\n<body>\n{body}\n</body>\n</html>\n'
    )


def _baseline_numbers(study: optuna.Study) -> set[int]:
    return {t.number for t in study.get_trials(deepcopy=False) if stored_trial.is_baseline(t)}


def write_figures(
    study: optuna.Study,
    out_dir: Path,
    trial_dirs: Mapping[int, Path],
    objectives: Sequence[tuple[str, str]],
    timeline_trials: Sequence[int] = (),
) -> dict[str, Path]:
    """Write the study's figures into ``out_dir`` (HTML, plotly.js from the CDN) with the data
    of each as CSV beside it; return ``{file name: path}`` of what was written.

    ``pareto.html`` + ``pareto.csv`` (:func:`trial_points`), ``parallel_coordinates.html`` (a
    plot per objective, one page), ``importances.html``, ``latency_cdf.html`` +
    ``latency_cdf.csv`` (every trial of ``trial_dirs``; the Pareto-front trials and the
    baseline are shown, the others start hidden in the legend) and ``timeline_<n>.html`` +
    ``timeline_<n>.csv`` for each of ``timeline_trials`` (its dir from ``trial_dirs``). A figure
    that fails is logged on the ``tuner`` logger and skipped: this never raises for a figure.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}

    def html(name: str, *figures: go.Figure) -> None:
        path = out_dir / name
        _write_html(path, figures)
        written[name] = path

    def csv(name: str, frame: pd.DataFrame) -> None:
        path = out_dir / name
        frame.to_csv(path, index=False)
        written[name] = path

    def pareto() -> None:
        points = trial_points(study)
        csv("pareto.csv", points)
        html("pareto.html", pareto_figure(points, objectives))

    def parallel() -> None:
        n = len(study.directions)
        html(
            "parallel_coordinates.html", *(parallel_coordinates_figure(study, i) for i in range(n))
        )

    def importances() -> None:
        html("importances.html", importance_figure(study))

    def latency() -> None:
        frame = latency_cdf_data(trial_dirs)
        csv("latency_cdf.csv", frame)
        baseline = _baseline_numbers(study)
        shown = {t.number for t in study.best_trials} | baseline
        present = set(int(t) for t in frame["trial"].unique()) if not frame.empty else set()
        labels = {n: f"trial {n} (vLLM defaults)" for n in baseline}
        highlight = sorted(shown & present) or None  # none of them measured: show all
        html("latency_cdf.html", latency_cdf_figure(frame, labels=labels, highlight=highlight))

    def timeline(number: int) -> Callable[[], None]:
        def job() -> None:
            if number not in trial_dirs:  # e.g. a study resumed on another machine
                log.info(
                    "figure timeline_%d not drawn: trial %d's folder is not on this machine "
                    "(python -m tuner report fetches it from MLflow)",
                    number,
                    number,
                )
                return
            frame = timeline_data(trial_dirs[number])
            csv(f"timeline_{number}.csv", frame)
            html(f"timeline_{number}.html", timeline_figure(frame, f"Trial {number}: telemetry"))

        return job

    jobs: list[tuple[str, Callable[[], None]]] = [
        ("pareto", pareto),
        ("parallel_coordinates", parallel),
        ("importances", importances),
        ("latency_cdf", latency),
        *((f"timeline_{n}", timeline(n)) for n in timeline_trials),
    ]
    for name, job in jobs:
        try:
            job()
        except Exception as exc:  # a figure must never cost the others (or the study)
            log.warning("figure %s not written: %s: %s", name, type(exc).__name__, exc)
            log.debug("figure %s failed", name, exc_info=True)
    return written
