"""Helpers the figure modules share: reading a ``.jsonl`` file, the annotated empty figure, a
subplot's centre and the trace palette."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative

__all__ = ["center_note", "message_figure", "palette", "panel_centre", "read_jsonl"]

log = logging.getLogger("tuner")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
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


def center_note(fig: go.Figure, text: str, size: int) -> None:
    fig.add_annotation(
        text=text, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False, font={"size": size}
    )


def message_figure(title: str, text: str) -> go.Figure:
    fig = go.Figure()
    center_note(fig, text, 15)
    fig.update_layout(
        title={"text": title},
        xaxis={"visible": False},
        yaxis={"visible": False},
        template="plotly_white",
    )
    return fig


def panel_centre(fig: go.Figure, row: int, col: int) -> dict[str, Any]:
    """Paper coordinates of a subplot's centre (in Chromium, an "x domain" reference to the
    axes of a subplot without traces was drawn in another panel)."""
    sub = fig.get_subplot(row, col)
    x0, x1 = sub.xaxis.domain
    y0, y1 = sub.yaxis.domain
    return {"xref": "paper", "yref": "paper", "x": (x0 + x1) / 2, "y": (y0 + y1) / 2}


def palette(n: int) -> list[str]:
    colors = list(qualitative.Plotly) if n <= 10 else list(qualitative.Dark24)
    return [colors[i % len(colors)] for i in range(n)]
