"""notebooks/*.ipynb run top to bottom as a person runs them headless (``jupyter nbconvert
--to notebook --execute``, from the ``notebooks`` extra; ``dev`` has it too) on two small studies
the CLI wrote on the simulator, one folder for both notebooks: a copy of the reference study
(chat, ``tests/helpers/reference.py``) and a long_docs study run beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import optuna
import pytest
from helpers.reference import Reference
from helpers.trials import counted

from tuner import stored_trial

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "study.n_trials=2",
    "workload.warmup_requests=0",
    "workload.output_tokens.low=8",
    "workload.output_tokens.high=16",
    "engine.env.TUNER_SIM_SPEEDUP=20",
    "confirm.rounds=1",  # a recommendation to export, from one fresh server per candidate
    "confirm.picks=[goodput,baseline]",
    # SLOs no stress run misses: at 20x a busy CI core's lag counts 20 times in the latencies.
    # Once (fresh-clone CI, 2026-12-03) the notebook found an exported config for one study of
    # the two, though the test passed alone; a confirm stage that demotes every pick under that
    # lag recommends nothing. The notebooks are tested here, not the SLOs
    "workload.slo.ttft_ms=600000",
    "workload.slo.tpot_ms=10000",
]


@pytest.fixture(scope="module")
def cwd(tmp_path_factory: pytest.TempPathFactory, reference_study: Reference) -> Path:
    """A folder where ``python -m tuner`` ran a chat and a long_docs study (with MLflow)."""
    here = reference_study.copy(tmp_path_factory.mktemp("notebooks") / "studies")
    p = subprocess.run(
        [sys.executable, "-m", "tuner", "+workload=long_docs", "workload.num_requests=4", *SMALL],
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


def test_pareto_fronts_notebook_compares_two_studies(cwd: Path) -> None:
    outputs, text = execute("pareto_fronts.ipynb", cwd)
    for workload, n_trials in (("chat", 4), ("long_docs", 2)):  # the reference study: 4
        trials = stored_trials(cwd, f"{workload}-qwen3-8b-sim")
        assert len(counted(trials)) == n_trials
        assert f"study {workload}-qwen3-8b-sim: {len(trials)} trials, workload {workload}" in text
    # each study's exported config came back from the MLflow run that published it
    assert text.count("(MLflow run ") == 2
    assert text.count("model: ") == 2 and "# best-" in text
    (fig,) = plotly_outputs(outputs)
    titles = {a["text"] for a in fig["layout"]["annotations"]}
    assert {"chat-qwen3-8b-sim", "long_docs-qwen3-8b-sim"} <= titles  # side by side
    for nb_file in ("pareto.ipynb", "pareto_fronts.ipynb"):  # committed without outputs
        stored = nbformat.read(ROOT / "notebooks" / nb_file, as_version=4)
        assert all(not c.get("outputs") for c in stored.cells if c.cell_type == "code")
