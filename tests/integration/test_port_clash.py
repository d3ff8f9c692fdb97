"""A port taken while the server starts is not the config's fault: the trial launches again."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
import pytest
from helpers.cli import FAST as SMALL

import tuner.study as study_mod
import tuner.trial as trial_mod
from tuner.config import TunerConfig
from tuner.engine.process import free_port
from tuner.storage import storage_url, study_name

pytestmark = pytest.mark.integration

FAST = [
    "+workload=chat",
    "engine=sim",
    "study.n_trials=1",
    "tracking=none",
    "confirm.enabled=false",
    "engine.startup_timeout_s=60",
    *SMALL,
]


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port some other program listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _ports(monkeypatch: pytest.MonkeyPatch, taken: int, times: int) -> list[int]:
    """The study's ``free_port`` hands out ``taken`` ``times`` times first, then free ports."""
    given: list[int] = []

    def fake(host: str = "127.0.0.1") -> int:
        port = taken if len(given) < times else free_port(host)
        given.append(port)
        return port

    monkeypatch.setattr(trial_mod, "free_port", fake)
    return given


def _trial(cfg: TunerConfig) -> optuna.trial.FrozenTrial:
    study = optuna.load_study(study_name=study_name(cfg), storage=storage_url(cfg))
    (trial,) = study.trials
    return trial


def test_a_taken_port_is_launched_again_on_another(
    make_cfg: Callable[..., TunerConfig], monkeypatch: pytest.MonkeyPatch, taken: int
) -> None:
    given = _ports(monkeypatch, taken, times=1)
    cfg = make_cfg(*FAST)
    study_mod.run(cfg)
    trial = _trial(cfg)
    assert given[0] == taken and len(given) == 2 and given[1] != taken
    assert trial.state == optuna.trial.TrialState.COMPLETE
    assert trial.user_attrs["failure_reason"] is None  # measured, not charged to the config
    assert trial.user_attrs["launched"] is True
    tdir = Path(trial.user_attrs["trial_dir"])
    assert "Address already in use" in (tdir / "server-attempt1.log").read_text()
    assert "Address already in use" not in (tdir / "server.log").read_text()
    assert f"--port {given[1]}" in " ".join(trial.user_attrs["argv"])  # the launch that ran


def test_a_port_taken_every_time_is_recorded_not_raised(
    make_cfg: Callable[..., TunerConfig], monkeypatch: pytest.MonkeyPatch, taken: int
) -> None:
    given = _ports(monkeypatch, taken, times=trial_mod.LAUNCH_ATTEMPTS)
    cfg = make_cfg(*FAST)
    study_mod.run(cfg)
    trial = _trial(cfg)
    assert given == [taken] * trial_mod.LAUNCH_ATTEMPTS  # then no more launches
    assert trial.state == optuna.trial.TrialState.COMPLETE
    assert trial.user_attrs["failure_reason"] == "crash"
    assert "Address already in use" in trial.user_attrs["failure_detail"]
    tdir = Path(trial.user_attrs["trial_dir"])
    kept = sorted(p.name for p in tdir.glob("server*.log"))
    assert kept == ["server-attempt1.log", "server-attempt2.log", "server.log"]
