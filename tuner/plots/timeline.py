"""The telemetry of one trial over its replay (``gpu.jsonl``, ``metrics.jsonl``): a long frame
(:func:`timeline_data`) and stacked panels sharing the time axis (:func:`timeline_figure`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tuner.artifacts import TrialFolder
from tuner.plots.common import message_figure, palette, panel_centre, read_jsonl

__all__ = ["timeline_data", "timeline_figure"]

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
    folder = TrialFolder(Path(trial_dir))
    gpu_path = folder.gpu
    if gpu_path.is_file():
        for r in read_jsonl(gpu_path):
            if "t_s" not in r:
                continue
            gpu = int(r.get("gpu", 0))
            for key, panel, series, scale in _GPU_FIELDS:
                if r.get(key) is not None:
                    rows.append(
                        (float(r["t_s"]), series.format(gpu=gpu), float(r[key]) * scale, panel)
                    )
    prom_path = folder.metrics
    if prom_path.is_file():
        for r in read_jsonl(prom_path):
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
        return message_figure(title, "no telemetry samples for this trial")
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
    colors = dict(zip(keys, palette(len(keys)), strict=True))
    for row, panel in enumerate(panels, start=1):
        sub = frame[frame["panel"] == panel]
        if sub.empty:
            why = " (NVML unavailable?)" if panel.startswith("gpu") else ""
            fig.add_annotation(
                text=f"no samples{why}",
                **panel_centre(fig, row, 1),
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
