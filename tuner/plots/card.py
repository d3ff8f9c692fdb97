"""The capacity card's figure (:mod:`tuner.capacity_card`): each config's capacity against the SLO
tier with its interval, and the GPUs each needs for the target load (else its capacity per GPU),
the picks beside vLLM's defaults."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tuner.plots.common import message_figure, palette

__all__ = ["card_data", "card_figure"]

_COLUMNS = [
    "trial",
    "label",
    "baseline",
    "scale",
    "capacity_rps",
    "capacity_low",
    "capacity_high",
    "rounds",
    "outside",
    "gpus_per_server",
    "gpus",
    "gpus_low",
    "gpus_high",
    "usd_per_m_output_tokens",
    "saving",
]


def card_data(card: Mapping[str, Any]) -> pd.DataFrame:
    """One row per config and SLO tier (``capacity_card.json``'s content, as
    :meth:`tuner.capacity_card.Card.as_dict` writes it); the plan's columns on every row of its
    config."""
    rows = []
    for e in card.get("entries", []):
        plan = e.get("plan") or {}
        for scale, est in sorted(e.get("tiers", {}).items(), key=lambda kv: float(kv[0])):
            rows.append(
                {
                    "trial": e["trial"],
                    "label": e["label"],
                    "baseline": bool(e.get("baseline")),
                    "scale": float(scale),
                    "capacity_rps": est["rps"],
                    "capacity_low": est["low"],
                    "capacity_high": est["high"],
                    "rounds": est["n"],
                    "outside": est.get("outside") or "",
                    "gpus_per_server": e.get("gpus_per_server", 1),
                    "gpus": plan.get("gpus"),
                    "gpus_low": plan.get("gpus_low"),
                    "gpus_high": plan.get("gpus_high"),
                    "usd_per_m_output_tokens": plan.get("usd_per_m_output_tokens"),
                    "saving": plan.get("saving"),
                }
            )
    return pd.DataFrame(rows, columns=_COLUMNS)


def _tier_name(scale: float, slo: Mapping[str, Any]) -> str:
    limits = ", ".join(
        f"{k.removesuffix('_ms').upper()} {float(v) * scale:,.4g} ms"
        for k, v in slo.items()
        if k != "percentile"
    )
    return f"×{scale:g}: {limits}" if limits else f"×{scale:g}"


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def card_figure(
    frame: pd.DataFrame,
    slo: Mapping[str, Any] | None = None,
    target_rps: float | None = None,
    title: str = "Capacity card",
) -> go.Figure:
    """Left: capacity (requests/s) per SLO tier, one line per config, the interval as error bars,
    a tier outside the measured loads as an open triangle at its bound (down: below the lowest
    load measured; up: at least the highest). Right: the GPUs each config needs for
    ``target_rps`` (the range from the interval), else its capacity per GPU at the workload's
    SLO."""
    if frame.empty:
        return message_figure(title, "no capacity steps were measured")
    slo = slo or {}
    pct = slo.get("percentile")
    right = (
        f"GPUs for {target_rps:,.4g} req/s" if target_rps is not None else "req/s per GPU (SLO ×1)"
    )
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.62, 0.38],
        subplot_titles=(
            "Capacity per SLO tier" + (f" (p{int(pct)})" if pct else ""),
            right,
        ),
    )
    trials = list(dict.fromkeys(frame["trial"]))
    colors = dict(zip(trials, palette(len(trials)), strict=True))
    scales = sorted(frame["scale"].unique())
    names = {s: _tier_name(s, slo) for s in scales}
    bars_x, bars_y, bars_lo, bars_hi, bars_c = [], [], [], [], []
    for trial in trials:
        rows = frame[frame["trial"] == trial].sort_values("scale")
        label = str(rows["label"].iloc[0])
        outside = list(rows["outside"])
        # outside the measured loads: a bound, drawn at the bound with an arrow-like marker
        # at most (a stricter tier bounded by the workload's): at the bound, down to what held
        y = [
            h if o == "below" else r
            for r, h, o in zip(rows["capacity_rps"], rows["capacity_high"], outside, strict=True)
        ]
        up = [
            0.0 if o else h - r
            for r, h, o in zip(rows["capacity_rps"], rows["capacity_high"], outside, strict=True)
        ]
        down = [
            0.0 if o in ("below", "above") else r - lo
            for r, lo, o in zip(rows["capacity_rps"], rows["capacity_low"], outside, strict=True)
        ]
        symbols = {
            "": "circle",
            "below": "triangle-down-open",
            "above": "triangle-up-open",
            "at_most": "triangle-down",
        }
        fig.add_trace(
            go.Scatter(
                x=[names[s] for s in rows["scale"]],
                y=y,
                mode="lines+markers",
                name=label,
                line={"color": colors[trial], "dash": "dot" if rows["baseline"].iloc[0] else None},
                marker={
                    "size": 12,
                    "symbol": [symbols.get(o, "circle") for o in outside],
                    "color": colors[trial],
                },
                error_y={"type": "data", "symmetric": False, "array": up, "arrayminus": down},
                customdata=list(zip(rows["rounds"], outside, strict=True)),
                hovertemplate="%{y:,.4g} req/s, %{customdata[0]} server(s) %{customdata[1]}"
                "<extra>" + label + "</extra>",
            ),
            row=1,
            col=1,
        )
        own = rows[rows["scale"] == 1.0]
        if own.empty:
            continue
        r = own.iloc[0]
        bars_x.append(label)
        bars_c.append(colors[trial])
        if target_rps is not None and _num(r["gpus"]) is not None:
            v = float(r["gpus"])
            bars_y.append(v)
            bars_lo.append(v - (_num(r["gpus_low"]) or v))
            bars_hi.append((_num(r["gpus_high"]) or v) - v)
        else:
            g = float(r["gpus_per_server"]) or 1.0
            v = float(r["capacity_rps"]) / g
            bars_y.append(v)
            bars_lo.append(v - float(r["capacity_low"]) / g)
            bars_hi.append(float(r["capacity_high"]) / g - v)
    fig.add_trace(
        go.Bar(
            x=bars_x,
            y=bars_y,
            marker={"color": bars_c},
            error_y={"type": "data", "symmetric": False, "array": bars_hi, "arrayminus": bars_lo},
            showlegend=False,
            hovertemplate="%{x}: %{y:,.4g}<extra></extra>",
        ),
        row=1,
        col=2,
    )
    notes = []
    if frame["outside"].isin(["below", "above"]).any():
        notes.append(
            "▽ / △: outside the measured loads: below the lowest load measured / at least the "
            "highest (a bound, not a crossing)"
        )
    if (frame["outside"] == "at_most").any():
        notes.append(
            "▼: a stricter tier at most the workload's, which fresh servers measured (down to "
            "the load its search held)"
        )
    if notes:
        fig.add_annotation(
            text="<br>".join(notes),
            xref="paper",
            yref="paper",
            x=0,
            y=-0.22,
            showarrow=False,
            font={"size": 11},
            xanchor="left",
        )
    fig.update_yaxes(title_text="requests/s within the SLOs", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=1, col=2)
    fig.update_layout(
        title={"text": title},
        template="plotly_white",
        legend={"orientation": "h", "y": -0.3},
        margin={"b": 140},
        height=520,
        width=1100,
    )
    return fig
