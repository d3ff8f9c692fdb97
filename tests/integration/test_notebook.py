"""notebooks/*.ipynb run top to bottom as a person runs them headless (``jupyter nbconvert
--to notebook --execute``, from the ``notebooks`` extra; ``dev`` has it too) on two small studies
the CLI wrote on the simulator, one folder for both notebooks: a copy of the reference study
(chat under ``objective=throughput``, ``tests/helpers/reference.py``) and a chat study under the
default objective, SLO capacity, run beside it (censored capacities, the capacity pick)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import optuna
import pytest
from helpers.capacity import BINDING_SLOS
from helpers.reference import Reference
from helpers.trials import counted

from tuner import stored_trial

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CAPACITY = [
    *BINDING_SLOS,  # its SLOs bind at ~16 in flight
    # 100 requests a replay, not chat's 300: its second trial's config serves ~5 req/s at 4 in
    # flight, so its own replay took 35 s of this study's 99 (2026-12-06)
    "workload.num_requests=100",
    "study.n_trials=2",
    "objective.capacity.max_steps=4",
    "confirm.rounds=1",  # a recommendation to export, from one fresh server per candidate
    "confirm.picks=[capacity,baseline]",
    # the notebooks show what the study stored, not how close its capacities are: the simulator
    # 10 times faster than the GPU it models (BINDING_SLOS's 1 keeps the host's lag small
    # against the SLOs), the study in ~20 s instead of ~50 (more of its capacities censored)
    "engine.env.TUNER_SIM_SPEEDUP=10",
]
CAPACITY_STUDY = "chat-qwen3-8b-sim-capacity"


@pytest.fixture(scope="module")
def cwd(tmp_path_factory: pytest.TempPathFactory, reference_study: Reference) -> Path:
    """A folder where ``python -m tuner`` ran two chat studies, throughput and capacity (with
    MLflow)."""
    here = reference_study.copy(tmp_path_factory.mktemp("notebooks") / "studies")
    p = subprocess.run(
        [sys.executable, "-m", "tuner", *CAPACITY],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return here


def execute(name: str, cwd: Path, **env: str) -> tuple[list[dict[str, Any]], str]:
    """Run notebooks/NAME with ``jupyter nbconvert --execute``, pointed at the studies in
    ``cwd``; its outputs (none an error: nbconvert stops on one) and its printed text."""
    out = cwd / "executed"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter",
            "nbconvert",
            "--to",
            "notebook",
            "--execute",
            "--ExecutePreprocessor.timeout=180",
            f"--output-dir={out}",
            str(ROOT / "notebooks" / name),
        ],
        cwd=cwd,
        env={**os.environ, "TUNER_CWD": str(cwd), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    nb = nbformat.read(out / name, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    return outputs, text


def stored_trials(cwd: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    url = f"sqlite:///{cwd / 'outputs' / 'state' / 'optuna.db'}"
    return optuna.load_study(study_name=name, storage=url).trials


def plotly_outputs(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o["data"]["application/vnd.plotly.v1+json"]
        for o in outputs
        if "application/vnd.plotly.v1+json" in o.get("data", {})
    ]


def test_pareto_notebook_executes(cwd: Path) -> None:
    outputs, text = execute("pareto.ipynb", cwd, TUNER_STUDY="chat-qwen3-8b-sim")
    trials = stored_trials(cwd, "chat-qwen3-8b-sim")
    assert len(counted(trials)) == 4  # and the configs refused before launch, if any
    assert f"study chat-qwen3-8b-sim: {len(trials)} trials" in text
    n_feasible = sum(stored_trial.feasible(t) for t in trials)
    assert f"{n_feasible} feasible trials" in text
    figures = plotly_outputs(outputs)
    assert len(figures) == 2  # the Pareto figure and the importances
    assert figures[1]["layout"]["title"]["text"].startswith("Param importances")


def test_the_pareto_notebook_shows_a_capacity_study(cwd: Path) -> None:
    outputs, text = execute("pareto.ipynb", cwd, TUNER_STUDY=CAPACITY_STUDY)
    trials = stored_trials(cwd, CAPACITY_STUDY)
    assert f"study {CAPACITY_STUDY}: {len(trials)} trials, objectives ['capacity_rps'" in text
    pareto = plotly_outputs(outputs)[0]
    hover = [h for t in pareto["data"] for h in (t.get("hovertext") or [])]
    assert any("capacity_rps" in h for h in hover)


def test_pareto_fronts_notebook_compares_two_studies(cwd: Path) -> None:
    outputs, text = execute("pareto_fronts.ipynb", cwd)
    for name, n_trials in (("chat-qwen3-8b-sim", 4), (CAPACITY_STUDY, 2)):  # the reference: 4
        trials = stored_trials(cwd, name)
        assert len(counted(trials)) == n_trials
        assert f"study {name}: {len(trials)} trials, workload chat" in text
    # each study's exported config came back from the MLflow run that published it
    assert text.count("(MLflow run ") == 2
    assert text.count("model: ") == 2 and "# best-" in text
    (fig,) = plotly_outputs(outputs)
    titles = {a["text"] for a in fig["layout"]["annotations"]}
    assert {"chat-qwen3-8b-sim", CAPACITY_STUDY} <= titles  # side by side
    tables = "".join(o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "capacity_rps" in tables  # the baseline-against-recommendation table shows it
    for nb_file in ("pareto.ipynb", "pareto_fronts.ipynb"):  # committed without outputs
        stored = nbformat.read(ROOT / "notebooks" / nb_file, as_version=4)
        assert all(not c.get("outputs") for c in stored.cells if c.cell_type == "code")
