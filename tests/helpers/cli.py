"""``python -m tuner`` as the tests run it: a subprocess (:func:`tuner`), or in this process for the
checks that fail before anything runs (:func:`main_in_process`); and the stores it writes."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra.core.global_hydra import GlobalHydra

# Small and fast, but every stage real: launch, replay over HTTP, score, Optuna, MLflow.
FAST = [
    "workload.num_requests=12",
    "workload.warmup_requests=1",
    "workload.arrival.concurrency=6",
    "workload.output_tokens.low=8",
    "workload.output_tokens.high=24",
    "engine.env.TUNER_SIM_SPEEDUP=20",
    # one replay a trial (the default objective, capacity, searches loads on each server: its
    # own tests, tests/integration/test_capacity_study.py and others, ask for it)
    "objective=throughput",
    # one confirm round (a fresh server per candidate); the confirm tests ask for more
    "confirm.rounds=1",
]


def tuner(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def main_in_process(
    cwd: Path, *args: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """``python -m tuner ARGS`` in ``cwd`` as :func:`tuner.__main__.main` in this process (no
    interpreter start, no imports again): its exit code, stdout and stderr. For commands that
    end before a study runs (a config error, a dry run); Hydra's logging set-up and the SIGTERM
    handler are put back after."""
    from tuner.__main__ import main

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["tuner", *args])
    # Hydra finds conf/ beside the app's file as for ``python -m tuner`` (its job name too),
    # not as the package tuner's resources
    monkeypatch.setenv("HYDRA_MAIN_MODULE", "__main__")
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    sigterm = signal.getsignal(signal.SIGTERM)
    GlobalHydra.instance().clear()
    capsys.readouterr()
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        GlobalHydra.instance().clear()
        signal.signal(signal.SIGTERM, sigterm)
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)
                with contextlib.suppress(Exception):
                    h.close()
        for h in handlers:
            if h not in root.handlers:
                root.addHandler(h)
        root.setLevel(level)
    out = capsys.readouterr()
    return code, out.out, out.err


def run_study(
    cfg: Any, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> str:
    """:func:`tuner.study.run` on ``cfg`` (a ``make_cfg`` config) in this process, for a study
    whose command line is not what is tested; what it printed and what the tuner logged at INFO,
    the two the CLI shows on stdout."""
    import tuner.study as study_mod

    caplog.set_level(logging.INFO, logger="tuner")
    capsys.readouterr()
    caplog.clear()
    study_mod.run(cfg)
    return capsys.readouterr().out + caplog.text


def storage(cwd: Path) -> str:
    return f"sqlite:///{cwd / 'outputs' / 'state' / 'optuna.db'}"


def mlflow_client(cwd: Path) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{cwd / 'mlflow.db'}")


def mlflow_runs(cwd: Path, experiment: str) -> list:
    client = mlflow_client(cwd)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    return client.search_runs([exp.experiment_id], max_results=1000)
