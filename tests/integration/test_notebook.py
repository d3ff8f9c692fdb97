"""notebooks/pareto.ipynb runs top to bottom on a study the CLI just wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import optuna
import pytest
from nbclient import NotebookClient

from .trials import counted

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def execute(
    name: str, cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[dict[str, Any]], str]:
    """Run notebooks/NAME top to bottom in ``cwd``; its outputs (none an error) and printed text."""
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    monkeypatch.setenv("TUNER_CWD", str(cwd))
    NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    return outputs, text


def stored_trials(cwd: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    url = f"sqlite:///{cwd / 'outputs' / 'state' / 'optuna.db'}"
    return optuna.load_study(study_name=name, storage=url).trials


def test_pareto_notebook_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner",
            "+workload=chat",
            "study.n_trials=4",
            "tracking=none",
            "workload.num_requests=8",
            "workload.warmup_requests=0",
            "workload.output_tokens.low=8",
            "workload.output_tokens.high=16",
            "engine.env.TUNER_SIM_SPEEDUP=20",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    outputs, text = execute("pareto.ipynb", tmp_path, monkeypatch)
    trials = stored_trials(tmp_path, "chat-qwen3-8b-sim")
    assert len(counted(trials)) == 4  # and the configs refused before launch, if any
    assert f"study chat-qwen3-8b-sim: {len(trials)} trials" in text
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs)


def test_pareto_fronts_notebook_compares_two_studies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = [
        "study.n_trials=3",
        "workload.warmup_requests=0",
        "workload.output_tokens.low=8",
        "workload.output_tokens.high=16",
        "engine.env.TUNER_SIM_SPEEDUP=20",
    ]
    for workload, n in (("chat", 8), ("long_docs", 4)):
        p = subprocess.run(
            [sys.executable, "-m", "tuner", f"+workload={workload}", f"workload.num_requests={n}"]
            + small,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr[-2000:]
    outputs, text = execute("pareto_fronts.ipynb", tmp_path, monkeypatch)
    for workload in ("chat", "long_docs"):
        trials = stored_trials(tmp_path, f"{workload}-qwen3-8b-sim")
        assert len(counted(trials)) == 3
        assert f"study {workload}-qwen3-8b-sim: {len(trials)} trials, workload {workload}" in text
    # each study's exported config came back from the MLflow run that published it
    assert text.count("(MLflow run ") == 2
    assert text.count("model: ") == 2 and "# best-" in text
    (fig,) = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    layout = fig["data"]["application/vnd.plotly.v1+json"]["layout"]
    titles = {a["text"] for a in layout["annotations"]}
    assert {"chat-qwen3-8b-sim", "long_docs-qwen3-8b-sim"} <= titles  # side by side
    for nb_file in ("pareto.ipynb", "pareto_fronts.ipynb"):  # committed without outputs
        stored = nbformat.read(ROOT / "notebooks" / nb_file, as_version=4)
        assert all(not c.get("outputs") for c in stored.cells if c.cell_type == "code")
