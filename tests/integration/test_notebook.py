"""notebooks/pareto.ipynb runs top to bottom on a study the CLI just wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


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
    nb = nbformat.read(ROOT / "notebooks" / "pareto.ipynb", as_version=4)
    monkeypatch.setenv("TUNER_CWD", str(tmp_path))
    NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "study chat-qwen3-8b: 4 trials" in text
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs)
