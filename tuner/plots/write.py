"""Writing every figure of a study as HTML with its frame as CSV beside it (:func:`write_figures`);
a figure that fails is logged and skipped.

The figures open without network (a GPU cluster often has none): each page loads plotly.js from
one ``plotly.min.js`` written beside it (plotly's ``include_plotlyjs="directory"``), 4.8 MB once
per folder instead of inlined in each of the six pages (~29 MB a run). A copy for a viewer that
shows one file on its own (MLflow's artifact view renders a page from a ``blob:`` URL, where no
sibling file can load) carries plotly.js inline: :func:`self_contained`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from tuner.plots.card import card_data, card_figure
from tuner.plots.latency import latency_cdf_data, latency_cdf_figure
from tuner.plots.optuna_figures import importance_figure, parallel_coordinates_figure
from tuner.plots.pareto import pareto_figure
from tuner.plots.points import trial_labels, trial_points
from tuner.plots.screen import screen_data, screen_figure
from tuner.plots.timeline import timeline_data, timeline_figure
from tuner.score import PER_GPU
from tuner.stored_study import baseline_trials

__all__ = ["PLOTLY_JS", "self_contained", "write_figures"]

log = logging.getLogger("tuner")


PLOTLY_JS = "plotly.min.js"
"""The plotly.js bundle :func:`write_figures` writes beside its pages; they load it by this name."""

_SCRIPT = f'<script charset="utf-8" src="{PLOTLY_JS}"></script>'
"""How a page of plotly's ``include_plotlyjs="directory"`` loads the bundle."""


def _write_html(path: Path, figures: Sequence[go.Figure]) -> None:
    """One figure, or several in one page (plotly.js loaded once), loading ``plotly.min.js``
    from the page's folder."""
    parts = [
        fig.to_html(full_html=False, include_plotlyjs="directory" if i == 0 else False)
        for i, fig in enumerate(figures)
    ]
    body = "\n".join(parts)
    path.write_text(
        f'<html>\n<head><meta charset="utf-8" /></head>\n<body>\n{body}\n</body>\n</html>\n',
        encoding="utf-8",
    )


def self_contained(page: Path, out_dir: Path) -> Path:
    """A copy of ``page`` (written by :func:`write_figures`) in ``out_dir``, same name, with
    plotly.js inline instead of loaded from ``plotly.min.js``: for a viewer that shows the page
    alone (MLflow's artifact view). ``ValueError`` if ``page`` does not load the bundle."""
    text = page.read_text(encoding="utf-8")
    if text.count(_SCRIPT) != 1:
        raise ValueError(f"{page} does not load {PLOTLY_JS} once")
    out = Path(out_dir) / page.name
    inline = f'<script charset="utf-8">{get_plotlyjs()}</script>'
    out.write_text(text.replace(_SCRIPT, inline), encoding="utf-8")
    return out


def write_figures(
    study: optuna.Study,
    out_dir: Path,
    trial_dirs: Mapping[int, Path],
    objectives: Sequence[tuple[str, str]],
    timeline_trials: Sequence[int] = (),
    card: Mapping[str, Any] | None = None,
    screen: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Path]:
    """Write the study's figures into ``out_dir`` (HTML, with ``plotly.min.js`` beside them:
    they open without network) with the data of each as CSV beside it; return ``{file name:
    path}`` of what was written.

    ``pareto.html`` + ``pareto.csv`` (:func:`trial_points`), ``parallel_coordinates.html`` (a
    plot per objective, one page), ``importances.html``, ``latency_cdf.html`` +
    ``latency_cdf.csv`` (every trial of ``trial_dirs``; the Pareto-front trials and the
    baseline are shown, the others start hidden in the legend), ``timeline.html`` (one figure per
    trial of ``timeline_trials`` whose dir ``trial_dirs`` has, in that order, on one page: one
    copy of plotly.js, not one per trial, where a page goes to MLflow alone) with
    ``timeline_<n>.csv`` for each, and with
    ``card`` (``capacity_card.json``'s content) ``capacity_card.html`` + ``capacity_card.csv``,
    and with ``screen`` (a lever screen's rows, :meth:`tuner.screen.LeverRow.as_dict`)
    ``screen.html`` + ``screen.csv``.
    A figure that fails is logged on the ``tuner`` logger and skipped: this never raises for a
    figure.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}

    def html(name: str, *figures: go.Figure) -> None:
        if PLOTLY_JS not in written:  # this plotly's bundle, not one an older run left here
            bundle = out_dir / PLOTLY_JS
            bundle.write_text(get_plotlyjs(), encoding="utf-8")
            written[PLOTLY_JS] = bundle
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
        baseline = {t.number for t in baseline_trials(study, which="any")}
        shown = {t.number for t in study.best_trials} | baseline
        present = set(int(t) for t in frame["trial"].unique()) if not frame.empty else set()
        points = trial_points(study)
        infeasible = {
            int(n)
            for n, status in zip(points["number"], points["status"], strict=True)
            if status not in ("pareto", "feasible")
        }
        highlight = sorted(shown & present) or None  # none of them measured: show all
        html(
            "latency_cdf.html",
            latency_cdf_figure(
                frame, labels=trial_labels(points), highlight=highlight, infeasible=infeasible
            ),
        )

    def timelines() -> None:
        labels = trial_labels(trial_points(study))
        figures = []
        for number in timeline_trials:
            if number not in trial_dirs:  # e.g. a study resumed on another machine
                log.info(
                    "trial %d's timeline not drawn: its folder is not on this machine "
                    "(python -m tuner report fetches it from MLflow)",
                    number,
                )
                continue
            frame = timeline_data(trial_dirs[number])
            csv(f"timeline_{number}.csv", frame)
            name = labels.get(number, f"trial {number}")
            title = f"{name[0].upper()}{name[1:]}: telemetry"  # "Trial 3 (infeasible: ...)"
            figures.append(timeline_figure(frame, title))
        if figures:
            html("timeline.html", *figures)

    def capacity_card() -> None:
        assert card is not None
        frame = card_data(card)
        csv("capacity_card.csv", frame)
        html(
            "capacity_card.html",
            card_figure(
                frame, card.get("slo"), card.get("target_rps"), f"{study.study_name}: capacity card"
            ),
        )

    def lever_screen() -> None:
        assert screen is not None
        frame = screen_data(screen)
        csv("screen.csv", frame)
        per_gpu = bool(screen) and screen[0].get("metric") == PER_GPU
        title = f"{study.study_name}: lever screen"
        html("screen.html", screen_figure(frame, title, per_gpu=per_gpu))

    jobs: list[tuple[str, Callable[[], None]]] = [
        ("pareto", pareto),
        ("parallel_coordinates", parallel),
        ("importances", importances),
        ("latency_cdf", latency),
        *([("timeline", timelines)] if timeline_trials else []),
        *([("capacity_card", capacity_card)] if card is not None else []),
        *([("screen", lever_screen)] if screen is not None else []),
    ]
    for name, job in jobs:
        try:
            job()
        except Exception as exc:  # a figure must never cost the others (or the study)
            log.warning("figure %s not written: %s: %s", name, type(exc).__name__, exc)
            log.debug("figure %s failed", name, exc_info=True)
    return written
