"""The lever screen's figure (:mod:`tuner.screen`): each lever's SLO-capacity change against
vLLM's defaults with its 95 % interval, coloured by the verdict word."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from tuner.plots.common import message_figure

__all__ = ["screen_data", "screen_figure"]

_COLUMNS = [
    "lever",
    "flag",
    "value",
    "numerics",
    "change_pct",
    "low_pct",
    "high_pct",
    "word",
    "servers",
    "default_servers",
    "failures",
    "censored",
    "follow_up",
    "quality",
    "quality_passed",
]

_COLOURS = {
    "gain": "#2ca02c",
    "loss": "#d62728",
    "no significant change": "#7f7f7f",
    "no interval": "#9467bd",
    "failed": "#000000",
    "not run yet": "#c7c7c7",
}


def _pct(v: Any) -> float | None:
    return None if v is None else 100.0 * float(v)


def _quality(q: Mapping[str, Any] | None) -> dict[str, Any]:
    """A lever's eval agreement with the defaults (None where not measured: no numerics change,
    dummy weights, no replays) and whether it passed the bound."""
    if not q or q.get("status") != "measured":
        return {"quality": None, "quality_passed": None}
    return {"quality": float(q["agreement"]), "quality_passed": bool(q["passed"])}


def screen_data(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per lever (:meth:`tuner.screen.LeverRow.as_dict`): its change and interval in %
    (None where there is none), the verdict word, the servers measured on each side, the
    failures and, for a lever that changes numerics on real weights, its eval agreement."""
    out = []
    for r in rows:
        g = r["change"]
        out.append(
            {
                "lever": r["lever"],
                "flag": r["flag"],
                "value": r["value"],
                "numerics": bool(r["numerics"]),
                "change_pct": _pct(g.get("value")),
                "low_pct": _pct(g.get("low")),
                "high_pct": _pct(g.get("high")),
                "word": r["word"],
                "servers": len(r["capacities"]),
                "default_servers": g.get("n_base", len(r["base"])),  # on its machines
                "failures": ", ".join(r["failures"]),
                "censored": bool(r["censored"]),
                "follow_up": bool(r["follow_up"]),
                **_quality(r.get("quality")),
            }
        )
    return pd.DataFrame(out, columns=_COLUMNS)


def screen_figure(frame: pd.DataFrame, title: str, per_gpu: bool = False) -> go.Figure:
    """Capacity change (%) per lever, a point with its interval as error bars, one trace per
    verdict word; failed levers are listed at 0 with their reason in the hover; a dashed line at
    0 (the defaults)."""
    if frame.empty:
        return message_figure(title, "no lever measured yet")
    fig = go.Figure()
    labels = [
        f"{lv}{' (numerics)' if n else ''}"
        for lv, n in zip(frame["lever"], frame["numerics"], strict=True)
    ]
    frame = frame.assign(label=labels)
    for w, colour in _COLOURS.items():
        part = frame[frame["word"] == w]
        if part.empty:
            continue
        x = part["change_pct"].astype(float).fillna(0.0)
        plus = (part["high_pct"].astype(float) - x).fillna(0.0)
        minus = (x - part["low_pct"].astype(float)).fillna(0.0)
        hover = [
            f"{flag}: {'' if pd.isna(c) else f'{c:+.1f} %'} "
            f"({n} vs {nb} servers){' — ' + f if f else ''}"
            for flag, c, n, nb, f in zip(
                part["flag"],
                part["change_pct"],
                part["servers"],
                part["default_servers"],
                part["failures"],
                strict=True,
            )
        ]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=part["label"],
                mode="markers",
                name=w,
                marker={"color": colour, "size": 10, "symbol": "x" if w == "failed" else "circle"},
                error_x={"type": "data", "array": plus, "arrayminus": minus, "visible": True},
                hovertext=hover,
                hoverinfo="text",
            )
        )
    fig.add_vline(x=0, line_dash="dash", line_color="#444")
    fig.update_layout(
        title={"text": title},
        xaxis={
            "title": f"SLO capacity{' per GPU' if per_gpu else ''} vs vLLM's defaults (%), "
            "95 % interval",
            "zeroline": False,
        },
        yaxis={"categoryorder": "array", "categoryarray": labels[::-1]},
        template="plotly_white",
        height=max(320, 40 * len(frame) + 140),
    )
    return fig
