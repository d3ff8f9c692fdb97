"""A simulator study with ``workload.client_loop=uvloop``: the tuner's own event loop (the trials,
the launcher, the replay with one process) and the client processes run on uvloop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import optuna
import pytest
from helpers.cli import FAST

import tuner.measure as measure_mod
import tuner.replay as replay_mod
import tuner.study as study_mod
from tuner.config import TunerConfig
from tuner.storage import storage_url, study_name

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("processes", [1, 2])
def test_a_study_on_uvloop(
    make_cfg: Callable[..., TunerConfig],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    processes: int,
) -> None:
    cfg = make_cfg(
        "+workload=chat",
        "engine=sim",
        "tracking=none",
        "confirm.enabled=false",
        "study.n_trials=1",
        "workload.client_loop=uvloop",
        f"workload.client_processes={processes}",
        *FAST,
    )
    loops: list[str] = []
    real = measure_mod.replay

    async def replay(*args: Any, **kw: Any) -> Any:
        loops.append(type(asyncio.get_running_loop()).__module__)
        assert kw["client_loop"] == "uvloop" and kw["processes"] == processes
        return await real(*args, **kw)

    monkeypatch.setattr(measure_mod, "replay", replay)
    monkeypatch.setattr(replay_mod, "CLIENT_LAG_WARN_MS", -1.0)  # any lag warns
    caplog.set_level(logging.WARNING, logger="tuner.study")
    study_mod.run(cfg)
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "Replay client: its event loop ran at most" in out
    assert "ms late at p99 (trial 0); over -1 ms in trial(s) 0, whose latencies include" in out
    assert loops and all(m.startswith("uvloop") for m in loops)
    study = optuna.load_study(study_name=study_name(cfg), storage=storage_url(cfg))
    (trial,) = study.trials
    assert trial.state == optuna.trial.TrialState.COMPLETE
    assert trial.user_attrs["failure_reason"] is None, trial.user_attrs.get("failure_detail")
    metrics = trial.user_attrs["metrics"]
    assert metrics["completed"] == 12
    # what the client itself cost, recorded beside the measurement
    assert 0.0 <= metrics["client_lag_p99_ms"] <= metrics["client_lag_max_ms"]
    assert metrics["client_cpu_max"] >= 0.0
    (warning,) = [
        r.getMessage() for r in caplog.records if "replay client was busy" in r.getMessage()
    ]
    assert f"raise workload.client_processes (now {processes})" in warning
    assert "uvloop" not in warning  # it already runs on uvloop
