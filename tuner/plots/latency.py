"""Latency distributions of each trial's measured requests (``requests.jsonl``): quantiles as a
frame (:func:`latency_cdf_data`) and their CDFs, a panel per metric (:func:`latency_cdf_figure`)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tuner.artifacts import TrialFolder
from tuner.plots.common import message_figure, palette, read_jsonl
from tuner.records import RequestRecord

__all__ = ["CDF_QUANTILES", "LATENCY_METRICS", "latency_cdf_data", "latency_cdf_figure"]

log = logging.getLogger("tuner")

LATENCY_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")
"""The metrics :func:`latency_cdf_data` can read from ``requests.jsonl``."""

CDF_QUANTILES: tuple[float, ...] = tuple(sorted({i / 100 for i in range(101)} | {0.995, 0.999}))
"""The quantiles at which :func:`latency_cdf_data` evaluates each distribution (0 … 1)."""


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
        path = TrialFolder(Path(trial_dirs[number])).requests
        if not path.is_file():
            log.debug("trial %d: no %s", number, path)
            continue
        rows = [r for r in read_jsonl(path) if r.get("status") == "ok" and not r.get("warmup")]
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


def latency_cdf_figure(
    frame: pd.DataFrame,
    *,
    labels: Mapping[int, str] | None = None,
    highlight: Sequence[int] | None = None,
    infeasible: Collection[int] = (),
) -> go.Figure:
    """The CDFs of :func:`latency_cdf_data`: a panel per metric, a line per trial (one colour
    and legend entry per trial across panels), dotted guides at p50/p95/p99.

    ``labels`` names trials in the legend (default ``trial <n>``; :func:`trial_labels` says
    why a trial is infeasible); with ``highlight``, the other trials start hidden
    (``legendonly``: a click on the legend shows them); the ``infeasible`` trials (a constraint
    violated, failed or pruned) are drawn dashed.
    """
    if frame.empty:
        return message_figure("Latency CDFs", "no measured requests in these trials")
    metrics = list(dict.fromkeys(frame["metric"]))
    trials = sorted(int(t) for t in frame["trial"].unique())
    colors = dict(zip(trials, palette(len(trials)), strict=True))
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
                    line={
                        "color": colors[trial],
                        "width": 2,
                        "dash": "dash" if trial in infeasible else "solid",
                    },
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
