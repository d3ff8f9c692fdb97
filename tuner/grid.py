"""Grid studies (``study=grid``) across runs: Optuna's grid sampler made safe for the tuner's
ask-and-tell loop and for a study continued by another run. Optuna counts an interrupted cell
as visited (:func:`interrupted_cells`: enqueued again by :func:`tuner.storage.fill_queue`), calls
``study.stop()`` after the last cell (:class:`GridSampler`), and re-runs random cells once the
grid is done (:func:`grid_left`: the trial loop stops at 0).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import optuna

from tuner.config import TunerConfig
from tuner.errors import INTERRUPTED
from tuner.space import grid

__all__ = ["GridSampler", "grid_left", "interrupted_cells"]


class GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler without its ``study.stop()`` once the last cell is told: the tuner
    asks and tells outside ``study.optimize``, where that call raises (after the trial's state is
    stored), and it looks up a ``grid_id`` that an enqueued trial (the baseline, an interrupted
    cell run again) does not have. The tuner's loop stops instead, once :func:`grid_left` is 0.
    Its seed (``tuner/storage.py``'s ``_sampler``) is the study's alone: Optuna shuffles the
    cells' ids with it, and a run that continued the H200's levers grid with another seed
    (``study.seed`` + the trials stored, as the other samplers get) ran 3 cells twice and left
    one out (2026-12-03)."""

    def after_trial(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        state: optuna.trial.TrialState,
        values: Sequence[float] | None,
    ) -> None:
        return None


def interrupted_cells(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The grid sampler's trials that were interrupted (FAIL, ``failure_reason`` interrupted):
    Optuna's :class:`~optuna.samplers.GridSampler` counts a finished trial's cell as visited,
    FAIL included, so without this the same command never measures that cell (the H200's
    levers grid lost ``quantization=fp8 stream_interval=8`` so, 2026-12-03). Enqueued again
    (:func:`enqueue_once`: not where the same params completed or are live)."""
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
        if "grid_id" in t.system_attrs and t.user_attrs.get("failure_reason") == INTERRUPTED
    ]


def grid_left(study: optuna.Study, cfg: TunerConfig) -> int | None:
    """Under ``study=grid``, how many of the grid's cells no trial has measured yet (COMPLETE or
    PRUNED; the baseline's run counts for the defaults' cell), else None: the trial loop stops
    at 0 rather than let Optuna run random cells again."""
    if cfg.study.sampler != "grid":
        return None
    cells = grid(cfg.space)
    names = list(cells)
    done = {
        tuple(t.params.get(n) for n in names)
        for t in study.get_trials(
            deepcopy=False,
            states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED),
        )
    }
    return sum(tuple(c) not in done for c in itertools.product(*cells.values()))
