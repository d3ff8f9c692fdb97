"""A confirm stage cut short (Ctrl-C, a tuner bug, a GPU machine taken back) goes on where it
stopped: every confirm server's results are stored in the study as it ends, and the same command
runs only the servers not stored. On the simulator, in this process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
import pytest
from helpers.cli import FAST, run_study

import tuner.study as study_mod
from tuner.config import TunerConfig
from tuner.records import TrialResult
from tuner.storage import storage_url
from tuner.stored_study import ConfirmRecord
from tuner.trial import run_server

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
    """Count the confirm servers :func:`tuner.study.run_server` starts (their trials); with
    ``cut_after``, the stage dies when that many have ended."""
    started: list[int] = []

    async def counted(*args: Any, **kwargs: Any) -> Any:
        if cut_after is not None and len(started) == cut_after:
            raise _Lost("the GPU machine was taken back")
        started.append(args[1])
        return await run_server(*args, **kwargs)

    monkeypatch.setattr(study_mod, "run_server", counted)
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

    monkeypatch.setattr(study_mod, "run_server", first_dies_at_start)
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
