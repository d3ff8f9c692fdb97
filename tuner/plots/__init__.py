"""Figures of a study and of its trials, data separate from drawing.

Each figure has a pure data function that returns a :class:`pandas.DataFrame` (tested without
plotly) and a drawing function that takes that frame and returns a
:class:`plotly.graph_objects.Figure`:

- :func:`trial_points` (and :func:`pareto_step`) → :func:`pareto_figure`; :func:`trial_labels`
  names each trial in the other figures, saying which are infeasible and why
- :func:`latency_cdf_data` → :func:`latency_cdf_figure`
- :func:`timeline_data` → :func:`timeline_figure`
- :func:`card_data` → :func:`card_figure`: the capacity card (:mod:`tuner.capacity_card`)
- :func:`screen_data` → :func:`screen_figure`: the lever screen (:mod:`tuner.screen`)
- Optuna's own plots, on the measured trials: :func:`parallel_coordinates_figure`,
  :func:`importance_figure`

:func:`write_figures` writes them all as HTML with each frame as CSV beside its figure and one
``plotly.min.js`` (:data:`PLOTLY_JS`) that the pages load, so they open without network; a figure
that fails is logged and skipped. :func:`self_contained` copies a page with plotly.js inline, for
a viewer that shows it alone (MLflow's artifact view).

The modules, one figure family each: ``points`` (the trial points and the Pareto staircase) and
``pareto`` (their figure), ``latency`` (latency CDFs), ``timeline`` (a trial's telemetry),
``card`` (the capacity card), ``screen`` (the lever screen), ``optuna_figures`` (Optuna's
parallel coordinates and importances on the measured trials),
``write`` (:func:`write_figures`) and ``common`` (helpers they share). This package re-exports
their public API: ``from tuner import plots`` then ``plots.trial_points(study)``.

A trial the tuner could not measure (``failure_reason`` user attr) is told to Optuna as COMPLETE
with penalty values and a violated ``failed_<reason>`` constraint: its values are *not*
measurements, so they are NaN here and such trials are counted, never plotted as points.
"""

from tuner.plots.card import card_data, card_figure
from tuner.plots.latency import (
    CDF_QUANTILES,
    LATENCY_METRICS,
    latency_cdf_data,
    latency_cdf_figure,
)
from tuner.plots.optuna_figures import importance_figure, parallel_coordinates_figure
from tuner.plots.pareto import pareto_figure
from tuner.plots.points import PARAM_PREFIX, STATUSES, pareto_step, trial_labels, trial_points
from tuner.plots.screen import screen_data, screen_figure
from tuner.plots.timeline import timeline_data, timeline_figure
from tuner.plots.write import PLOTLY_JS, self_contained, write_figures

__all__ = [
    "CDF_QUANTILES",
    "LATENCY_METRICS",
    "PARAM_PREFIX",
    "PLOTLY_JS",
    "STATUSES",
    "card_data",
    "card_figure",
    "importance_figure",
    "latency_cdf_data",
    "latency_cdf_figure",
    "parallel_coordinates_figure",
    "pareto_figure",
    "pareto_step",
    "screen_data",
    "screen_figure",
    "self_contained",
    "timeline_data",
    "timeline_figure",
    "trial_labels",
    "trial_points",
    "write_figures",
]
