"""What a study's stored trials say, for the integration tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from wsgiref.util import setup_testing_defaults

import optuna

from tuner.stored_trial import counted as counts


def counted(trials: Sequence[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """The trials that count toward ``study.n_trials``: all but the configs the precheck refused
    before launch (not launched, no GPU leased), which are free up to ``study.max_rejected``."""
    return [t for t in trials if counts(t)]


def pareto_front_kinds(study: optuna.Study) -> dict[int, str]:
    """Each COMPLETE trial's kind as Optuna's own ``plot_pareto_front`` draws it: ``Best``,
    ``Feasible`` or ``Infeasible`` (the trace a point is in)."""
    kinds: dict[int, str] = {}
    for trace in optuna.visualization.plot_pareto_front(study).data:
        kind = trace.hovertemplate.split("<extra>")[1].split(" Trial")[0]
        for text in trace.text or ():
            kinds[json.loads(text.replace("<br>", "\n"))["number"]] = kind
    return kinds


def dashboard_constraints(storage: str, study_name: str) -> dict[int, list[float]]:
    """Each trial's constraints as optuna-dashboard serves them to its pages (its JSON API, on
    its WSGI app; a trial is feasible there when every value is <= 0, infeasible when one is
    > 0, and feasible when the list is empty)."""
    import optuna_dashboard

    app = optuna_dashboard.wsgi(storage)

    def get(path: str) -> Any:
        environ: dict[str, Any] = {}
        setup_testing_defaults(environ)
        environ["PATH_INFO"] = path
        status: list[str] = []
        body = b"".join(app(environ, lambda s, h, exc_info=None: status.append(s)))
        assert status[0].startswith("200"), (path, status, body[:300])
        return json.loads(body)

    (study_id,) = [
        s["study_id"]
        for s in get("/api/studies")["study_summaries"]
        if s["study_name"] == study_name
    ]
    return {t["number"]: t["constraints"] for t in get(f"/api/studies/{study_id}")["trials"]}
