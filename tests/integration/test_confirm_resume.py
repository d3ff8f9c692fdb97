"""A confirm stage cut short (Ctrl-C, a tuner bug, a GPU machine taken back) goes on where it
stopped: every confirm server's results are stored in the study as it ends, and the same command
runs only the servers not stored. On the simulator, in this process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
import pytest
from helpers.cli import FAST, run_study

import tuner.confirm_stage as confirm_stage
import tuner.study as study_mod
from tuner.config import TunerConfig
from tuner.deadline import Deadline
from tuner.records import TrialResult
from tuner.storage import storage_url
from tuner.stored_study import ConfirmRecord
from tuner.trial import run_server, run_trial

COMMON = [
    "+workload=chat",
    "tracking=none",
    "study.name=resume",
    *FAST,
    "confirm.rounds=2",
    "confirm.picks=[latency,throughput,baseline]",
]


class _Lost(RuntimeError):
    """The machine went away."""


def _count_servers(monkeypatch: pytest.MonkeyPatch, cut_after: int | None) -> list[int]:
    """Count the confirm servers :func:`tuner.confirm_stage.run_server` starts (their trials); with
    ``cut_after``, the stage dies when that many have ended."""
    started: list[int] = []

    async def counted(*args: Any, **kwargs: Any) -> Any:
        if cut_after is not None and len(started) == cut_after:
            raise _Lost("the GPU machine was taken back")
        started.append(args[1])
        return await run_server(*args, **kwargs)

    monkeypatch.setattr(confirm_stage, "run_server", counted)
    return started


def test_a_confirm_stage_cut_short_goes_on_where_it_stopped(
    make_cfg: Callable[..., TunerConfig],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = make_cfg(*COMMON, "study.n_trials=2")
    first = _count_servers(monkeypatch, cut_after=1)
    with pytest.raises(_Lost):
        study_mod.run(cfg)
    assert len(first) == 1
    study = optuna.load_study(study_name="resume", storage=storage_url(cfg))
    assert ConfirmRecord.from_study(study) is None  # the stage did not end
    stored = study.user_attrs["confirm_runs"]["runs"]
    assert list(stored) == [f"{first[0]}/1"]
    kept = stored[f"{first[0]}/1"][0]["metrics"]

    again = _count_servers(monkeypatch, cut_after=None)
    out = run_study(make_cfg(*COMMON, "study.n_trials=0"), capsys, caplog)
    assert out.count("stored by an earlier run") == 1
    study = optuna.load_study(study_name="resume", storage=storage_url(cfg))
    record = ConfirmRecord.from_study(study)
    assert record is not None and record.verdict is not None
    total = len(record.candidates) * 2
    assert total >= 2 and len(again) == total - 1  # all but the stored server
    assert all(len({row["round"] for row in r.runs}) == 2 for r in record.results)
    (reused,) = [
        row for r in record.results if r.trial == first[0] for row in r.runs if row["round"] == 1
    ]
    assert reused["output_throughput"] == kept["output_throughput"]

    # other stress settings: nothing stored stands for them, every server runs
    other = _count_servers(monkeypatch, cut_after=None)
    out = run_study(
        make_cfg(*COMMON, "study.n_trials=0", "confirm.load_factor=1.5"), capsys, caplog
    )
    assert "stored by an earlier run" not in out
    assert len(other) == total


def test_a_server_that_never_became_ready_is_tried_again(
    make_cfg: Callable[..., TunerConfig],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On the H200 every fp8 confirm server died at start ("No module named
    'compressed_tensors'"); once the module was there, the same command must start them again,
    not reuse the stored crash (tests/unit/test_stored_study.py: which failures are kept)."""
    cfg = make_cfg(*COMMON, "study.n_trials=2")
    started: list[int] = []
    crashed: list[int] = []

    async def first_dies_at_start(*args: Any, **kwargs: Any) -> Any:
        started.append(args[1])
        got = await run_server(*args, **kwargs)
        if not crashed:  # the first server: as if it had exited before /health answered
            crashed.append(args[1])
            return [
                TrialResult(
                    number=args[1],
                    params={},
                    argv=(),
                    values=None,
                    constraints={},
                    metrics={},
                    failure_reason="crash",
                    failure_detail="exit code 1",
                    launched=True,
                )
                for _ in got
            ]
        return got

    monkeypatch.setattr(confirm_stage, "run_server", first_dies_at_start)
    run_study(cfg, capsys, caplog)
    study = optuna.load_study(study_name="resume", storage=storage_url(cfg))
    stored = study.user_attrs["confirm_runs"]["runs"]
    assert f"{crashed[0]}/1" not in stored  # the crash at start is not kept
    total = len(started)
    assert len(stored) == total - 1

    again = _count_servers(monkeypatch, cut_after=None)
    out = run_study(make_cfg(*COMMON, "study.n_trials=0"), capsys, caplog)
    assert again == [crashed[0]]  # only the server that never became ready runs again
    assert out.count("stored by an earlier run") == 1  # that candidate's round 2
    record = ConfirmRecord.from_study(
        optuna.load_study(study_name="resume", storage=storage_url(cfg))
    )
    assert record is not None
    (result,) = [r for r in record.results if r.trial == crashed[0]]
    assert {row["round"] for row in result.runs} == {1, 2}
    assert not any(row["failure_reason"] for row in result.runs)


def _servers_take_100_s(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every server, a trial's or a confirm server, takes 100 s on the deadline's clock (the
    sim's take seconds); the trials and confirm servers started, in order."""
    now = [0.0]
    started: list[int] = []

    def slow(run: Any) -> Any:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started.append(args[1])
            got = await run(*args, **kwargs)
            now[0] += 100.0
            return got

        return timed

    monkeypatch.setattr(study_mod, "run_trial", slow(run_trial))
    monkeypatch.setattr(confirm_stage, "run_server", slow(run_server))
    monkeypatch.setattr(study_mod, "Deadline", lambda s: Deadline(s, clock=lambda: now[0]))
    return started


def test_a_deadline_starts_no_server_that_would_not_fit_and_the_same_command_goes_on(
    make_cfg: Callable[..., TunerConfig],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``study.deadline_s``: no trial or confirm server starts unless one more fits before it,
    nothing is cut short, no verdict is stored from part of the confirm stage, and the same
    command runs only what is missing. 3 rounds: at least 3 confirm servers, whatever the picks."""
    args = [a for a in COMMON if a != "confirm.rounds=2"] + ["confirm.rounds=3"]
    started = _servers_take_100_s(monkeypatch)
    out = run_study(make_cfg(*args, "study.n_trials=4", "study.deadline_s=250"), capsys, caplog)
    assert started == [0, 1]  # at 200 s, 50 s are left and a server takes 100
    assert (
        "study.deadline_s (250 s): 50 s left, and the study's 2 servers took 100 s on average: "
        "no new trial after 2 of 4" in out
    )
    assert "stopped before server 1 of" in out  # nor a confirm server
    assert "not confirmed on fresh servers" in out  # the recommendation says so
    study = optuna.load_study(study_name="resume", storage=storage_url(make_cfg(*args)))
    assert len(study.trials) == 2 and all(t.state.is_finished() for t in study.trials)
    assert "interrupted" not in out
    assert ConfirmRecord.from_study(study) is None and "confirm_runs" not in study.user_attrs

    # a new window: the stored trials' wall times (seconds on the sim) and this run's servers
    # (100 s) let two confirm servers start, not a third (50 s left, a mean of at least 50 s)
    started = _servers_take_100_s(monkeypatch)
    out = run_study(make_cfg(*args, "study.n_trials=0", "study.deadline_s=250"), capsys, caplog)
    assert len(started) == 2
    assert "stopped before server 3 of" in out
    study = optuna.load_study(study_name="resume", storage=storage_url(make_cfg(*args)))
    assert len(study.user_attrs["confirm_runs"]["runs"]) == 2
    assert ConfirmRecord.from_study(study) is None  # no verdict from 2 of the servers

    again = _count_servers(monkeypatch, cut_after=None)
    out = run_study(make_cfg(*args, "study.n_trials=0"), capsys, caplog)
    assert out.count("stored by an earlier run") == 2
    assert "Recommended: trial" in out and "not confirmed" not in out
    record = ConfirmRecord.from_study(
        optuna.load_study(study_name="resume", storage=storage_url(make_cfg(*args)))
    )
    assert record is not None and record.verdict is not None
    servers = {(r.trial, row["round"]) for r in record.results for row in r.runs}
    assert len(servers) == len(again) + 2 >= 3  # the stored 2 and the rest, none twice
