"""The Pareto figure: the trials of :func:`~tuner.plots.points.trial_points` on the first two
objectives, the front as a staircase and the baseline (vLLM's defaults) as a star."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tuner.plots.common import center_note
from tuner.plots.points import PARAM_PREFIX, Objectives, objective_signs, pareto_step

__all__ = ["pareto_figure"]


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
_BELOW_MARKER = {"symbol": "triangle-down-open", "size": 16, "color": "#333"}
"""A capacity censored above (the incumbent probe lost): the value is under this point."""
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
    capacity = row.get("capacity_shown")
    lines += [
        f"{m}: {capacity} (censored)"
        if m == "capacity_rps" and isinstance(capacity, str)
        else f"{m}: {_fmt(row[m])}"
        for m in metrics
        if m in row.index
    ]
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
    objective_signs(objectives)
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

    def markers(rows: pd.DataFrame, name: str, group: str, marker: dict[str, Any]) -> None:
        rank = _LEGEND_RANK.get(group)
        fig.add_trace(
            go.Scatter(
                x=rows[xcol],
                y=rows[ycol],
                mode="markers",
                marker=marker,
                name=name,
                legendgroup=group,
                **({} if rank is None else {"legendrank": rank}),
                customdata=rows["number"],
                hovertext=[_hover(r, metrics) for _, r in rows.iterrows()],
                hoverinfo="text",
            )
        )

    base = points[points["baseline"].astype(bool)].dropna(subset=[xcol, ycol])
    if not base.empty:  # under the status markers: a Pareto baseline shows both
        markers(base, "baseline (vLLM defaults)", "baseline", _BASELINE_MARKER)
    for status, style in _STATUS_STYLE.items():
        sub = points[(points["status"] == status)].dropna(subset=[xcol, ycol])
        if not sub.empty:
            markers(sub, f"{style['label']} ({len(sub)})", status, style["marker"])
    below = points[points["capacity_shown"].fillna("").astype(str).str.startswith("<")]
    below = below.dropna(subset=[xcol, ycol])
    if not below.empty:  # censored above: the capacity is under the load that failed
        name = f"capacity below this: lost at the incumbent's load ({len(below)})"
        markers(below, name, "censored", _BELOW_MARKER)
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
        center_note(fig, "no measured trial yet", 16)
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
