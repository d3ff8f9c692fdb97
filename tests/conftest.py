"""Shared fixtures: configs composed through Hydra exactly as the CLI composes them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

from tuner.checks import load_config
from tuner.config import TunerConfig

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def make_cfg(tmp_path: Path) -> Callable[..., TunerConfig]:
    """``make_cfg("+workload=chat", "study.n_trials=2")`` → a validated TunerConfig whose outputs
    (run dir, Optuna storage, MLflow store) all live under ``tmp_path``."""

    def make(*overrides: str) -> TunerConfig:
        GlobalHydra.instance().clear()
        base = [
            f"paths.output_dir={tmp_path / 'run'}",
            f"paths.state_dir={tmp_path / 'state'}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
        ]
        return load_config(base + list(overrides))

    return make
