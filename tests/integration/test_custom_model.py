"""``model=custom`` through the CLI: a local model directory without any model YAML, and a Hugging
Face repo id from a prepared offline cache, each planned (``dry_run``) and tuned on the simulator."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tuner.stored_study import model_name

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ROOT / "models" / "qwen-0.5b-dummy"  # max_position_embeddings 32768
SHA = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_secret_token_4321"


def tuner(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "400", **env},  # rich folds a long path mid-word
    )


def local_model(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A model directory outside the checkout, copied from a shipped shape (links followed)."""
    d = shutil.copytree(SHAPE, tmp_path / "models" / "My-Qwen")
    return str(d), {}


def hub_model(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """``Org/Tiny-Qwen`` in an offline Hugging Face cache (``HF_HOME``), laid out as
    huggingface_hub writes it; ``HF_TOKEN`` set, as for a gated repo."""
    home = tmp_path / "hf"
    repo = home / "hub" / "models--Org--Tiny-Qwen"
    shutil.copytree(SHAPE, repo / "snapshots" / SHA)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    env = {"HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_OFFLINE": "1"}
    return "Org/Tiny-Qwen", {**env, "HF_TOKEN": TOKEN}


@pytest.mark.parametrize(("source", "name"), [(local_model, "my-qwen"), (hub_model, "tiny-qwen")])
def test_a_custom_model_is_planned_and_tuned(tmp_path: Path, source, name: str) -> None:
    path, env = source(tmp_path)
    model = ["model=custom", f"model.path={path}"]
    # space=full: the default space does not search max_model_len, whose choices end at the model's
    p = tuner(
        tmp_path, "+workload=chat", *model, "engine=vllm", "space=full", "dry_run=true", env=env
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = " ".join(p.stdout.split())  # rich wraps long lines
    assert f"study chat-{name}-vllm" in out
    assert "max_model_len 32768, vLLM's default load format (the real weights)" in out
    assert "max_model_len: CategoricalDistribution(choices=(4096, 8192, 16384, 32768))" in out
    assert f"serve {path} --host 127.0.0.1" in out
    assert "--load-format" not in out
    assert TOKEN not in p.stdout + p.stderr

    p = tuner(
        tmp_path,
        "+workload=chat",
        *model,
        "study.n_trials=2",
        "tracking=none",
        "confirm.enabled=false",
        "workload.num_requests=8",
        "workload.warmup_requests=0",
        "workload.arrival.concurrency=4",
        "workload.output_tokens.low=8",
        "workload.output_tokens.high=16",
        "engine.env.TUNER_SIM_SPEEDUP=20",
        # the default objective's search, cut to one step after the workload's own replay (the
        # whole search took 8 replays)
        "objective.capacity.max_steps=2",
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert TOKEN not in p.stdout + p.stderr
    storage = f"sqlite:///{tmp_path / 'outputs' / 'state' / 'optuna.db'}"
    study = optuna.load_study(study_name=f"chat-{name}-sim-capacity", storage=storage)
    assert model_name(study) == name
    assert len(study.trials) == 2
    for t in study.trials:
        assert t.user_attrs["failure_reason"] is None, t.user_attrs["failure_detail"]
        assert t.user_attrs["metrics"]["completed"] == 8
    serve_args = study.trials[0].user_attrs["serve_args"]
    assert serve_args[0] == path and "--load-format" not in serve_args
