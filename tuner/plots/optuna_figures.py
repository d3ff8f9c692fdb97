"""Optuna's own figures (parallel coordinates, param importances) on the measured trials only: a
failed trial's penalty values would swamp them."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import optuna
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tuner import stored_trial
from tuner.plots.common import message_figure, panel_centre
from tuner.plots.points import metric_names

__all__ = ["importance_figure", "parallel_coordinates_figure"]

log = logging.getLogger("tuner")


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
    names = metric_names(study)
    if not 0 <= objective_index < len(names):
        raise ValueError(f"objective_index {objective_index} not in 0..{len(names) - 1}")
    name = names[objective_index]
    title = f"Parallel coordinates — {name}"
    measured = _measured(study)
    if not measured:
        return message_figure(title, "no measured trial yet (every trial failed or is running)")
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
    names = metric_names(study)
    measured = _measured(study)
    title = f"Param importances ({len(measured)} measured trials)"
    if len(measured) < 2:
        return message_figure(
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
                **panel_centre(fig, 1, i + 1),
                showarrow=False,
            )
            continue
        for trace in sub.data:
            trace.showlegend = False
            fig.add_trace(trace, row=1, col=i + 1)
        fig.update_xaxes(title_text="importance", row=1, col=i + 1)
    if errors == len(names):
        return message_figure(title, "Optuna could not evaluate the importances (see the log)")
    fig.update_layout(
        title={"text": title}, template="plotly_white", height=max(400, 40 * _n_params(study))
    )
    return fig


def _n_params(study: optuna.Study) -> int:
    return len({k for t in study.get_trials(deepcopy=False) for k in t.params})
