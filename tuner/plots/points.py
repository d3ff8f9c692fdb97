"""The data of the Pareto figure: one row per trial (:func:`trial_points`) and the front as a
staircase (:func:`pareto_step`); pure pandas, no plotly.

A trial the tuner could not measure (``failure_reason`` user attr) is told to Optuna as COMPLETE
with penalty values and a violated ``failed_<reason>`` constraint: its values are *not*
measurements, so they are NaN here and such trials are counted, never plotted as points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import optuna
import pandas as pd

from tuner import stored_trial
from tuner.capacity import shown
from tuner.errors import INTERRUPTED

__all__ = [
    "PARAM_PREFIX",
    "STATUSES",
    "Objectives",
    "metric_names",
    "objective_signs",
    "pareto_step",
    "trial_labels",
    "trial_points",
]

STATUSES: tuple[str, ...] = ("pareto", "feasible", "infeasible", "failed", "pruned", "running")
"""The values of ``trial_points(...)["status"]``."""

PARAM_PREFIX = "params_"
"""Param columns of :func:`trial_points` are ``params_<name>`` (as Optuna's trials_dataframe)."""

Objectives = Sequence[tuple[str, str]]


def metric_names(study: optuna.Study) -> list[str]:
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
    if stored_trial.violated(t):
        return "infeasible"
    return "feasible"


def trial_points(study: optuna.Study) -> pd.DataFrame:
    """One row per trial of ``study``.

    Columns: ``number``, ``state`` (Optuna's state name), one column per objective named as
    ``study.metric_names`` (``value_<i>`` if the study has none), ``status`` (one of
    :data:`STATUSES`), ``baseline`` (the ``baseline`` user attr), ``failure_reason`` and
    ``violated`` (comma-separated names of the constraints > 0), both missing (NaN) when there
    is none, ``capacity_shown`` (a censored capacity as the tables show it, ``< 58.2 (~20.5)``
    or ``>= 69.7``: :func:`tuner.capacity.shown`; missing when bracketed or not a capacity
    study), and ``params_<name>`` for every param.

    ``status``: *pruned* and *running* (RUNNING or WAITING) follow the state; *failed* is a
    trial with a ``failure_reason`` user attr (COMPLETE with penalty values) or in state FAIL
    (interrupted, or a tuner bug: reason ``tuner_error``/``interrupted``); *pareto* is a trial
    of ``study.best_trials`` (which honours the constraints); *infeasible* is COMPLETE with a
    constraint > 0; the rest is *feasible*. Objectives are NaN unless the status is pareto,
    feasible or infeasible.
    """
    names = metric_names(study)
    best = {t.number for t in study.best_trials}
    rows: list[dict[str, Any]] = []
    for t in study.get_trials(deepcopy=False):
        status = _status(t, best)
        reason = stored_trial.failure_reason(t)
        if status == "failed" and not reason:
            reason = "tuner_error" if stored_trial.tuner_error(t) else INTERRUPTED
        measured = status in ("pareto", "feasible", "infeasible") and t.values is not None
        values = list(t.values) if measured and t.values is not None else []
        violated = stored_trial.violated(t)
        row: dict[str, Any] = {"number": t.number, "state": t.state.name}
        for i, name in enumerate(names):
            row[name] = float(values[i]) if i < len(values) else math.nan
        row["status"] = status
        row["baseline"] = stored_trial.is_baseline(t)
        row["failure_reason"] = reason or None
        row["violated"] = ",".join(violated) or None
        row["capacity_shown"] = _capacity_shown(t) if measured else None
        for k, v in t.params.items():
            row[PARAM_PREFIX + k] = v
        rows.append(row)
    columns = [
        "number", "state", *names, "status", "baseline", "failure_reason", "violated",
        "capacity_shown",
    ]  # fmt: skip
    frame = pd.DataFrame(rows, columns=None if rows else columns)
    return frame.sort_values("number", ignore_index=True) if rows else frame


def objective_signs(objectives: Objectives) -> list[float]:
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
    sx, sy = objective_signs(objectives[:2])
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


def trial_labels(points: pd.DataFrame) -> dict[int, str]:
    """A name per trial of :func:`trial_points` for a legend or a title: ``trial <n>``, with
    ``vLLM defaults`` for the baseline and, unless it is feasible, why: ``trial 4 (infeasible:
    slo_ttft)``, ``trial 0 (vLLM defaults, failed: cuda_oom)``, ``trial 6 (pruned)``."""
    labels: dict[int, str] = {}
    for row in points.itertuples(index=False):
        notes = ["vLLM defaults"] if bool(row.baseline) else []
        if row.status == "infeasible":
            notes.append(f"infeasible: {row.violated}")
        elif row.status == "failed":
            notes.append(f"failed: {row.failure_reason}")
        elif row.status in ("pruned", "running"):
            notes.append(str(row.status))
        number = int(row.number)
        labels[number] = f"trial {number}" + (f" ({', '.join(notes)})" if notes else "")
    return labels


def _capacity_shown(t: optuna.trial.FrozenTrial) -> str | None:
    censored = stored_trial.metric(t, "capacity_censored")
    rps = stored_trial.metric(t, "capacity_rps")
    if not censored or rps is None:
        return None
    return shown(rps, censored, stored_trial.metric(t, "capacity_rps_high"))
