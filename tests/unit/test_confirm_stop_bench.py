"""``benchmarks/confirm_stop.py`` on a stored study: which picks each rule settles before round
3, the servers that saves, and the verdict with the stopped rounds left out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from helpers.benchmarks import load_benchmark

from tuner.config import ConfirmConfig, ObjectiveConfig, ObjectiveSpec
from tuner.confirm import verdict
from tuner.records import Candidate, ConfirmResult
from tuner.stored_study import ConfirmRecord


def _result(trial: int, picks: tuple[str, ...], values: list[float]) -> ConfirmResult:
    runs = tuple({"round": i, "seed": 1, "capacity_rps": v} for i, v in enumerate(values, 1))
    return ConfirmResult(trial, picks, {}, True, None, {"capacity_rps": min(values)}, {}, runs)


def _study(tmp_path: Path, values: dict[int, list[float]], rounds: int = 3) -> Path:
    db = tmp_path / "optuna.db"
    study = optuna.create_study(
        study_name="chat-sim-capacity", storage=f"sqlite:///{db}", directions=["maximize"]
    )
    names = {0: ("baseline",), 5: ("latency",), 8: ("capacity",)}
    cands = [Candidate(t, names[t], {}, t == 0, (), {}) for t in values]
    results = [_result(t, names[t], v) for t, v in values.items()]
    cc = ConfirmConfig(picks=["capacity", "latency", "baseline"], rounds=rounds)
    objective = ObjectiveConfig(objectives=[ObjectiveSpec("capacity_rps", "maximize")])
    decided = verdict(results, cands, objective, cc.min_effect, rounds)
    ConfirmRecord.of(cc, 12, cands, results, decided).store(study)
    return db


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_benchmark("confirm_stop")


def test_the_pooled_spread_settles_the_noisy_pick_and_keeps_the_verdict(
    bench: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the noisy pick: 3.3 % below the defaults, its servers 4 % apart (test_confirm's numbers)
    values = {
        5: [95.0, 99.0, 97.0],
        8: [102.0, 102.5, 102.2],
        0: [100.0, 100.5, 100.2],
    }
    db = _study(tmp_path, values)
    out = tmp_path / "confirm_stop.json"
    assert bench.main([str(db), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (s,) = doc["studies"]
    by = {p["trial"]: p for p in s["picks"]}
    assert (by[5]["welch"], by[5]["pooled"]) == (False, True)
    assert (by[8]["welch"], by[8]["pooled"]) == (False, False)  # +2 %: still might reach +3 %
    assert s["welch"]["servers_saved"] == 0 and s["pooled"]["servers_saved"] == 1
    assert s["pooled"]["same_verdict"] and s["verdict_all_rounds"] == s["pooled"]["verdict"]
    assert doc["summary"]["pooled"] == {
        "picks_settled": 1,
        "servers_saved": 1,
        "verdicts_changed": 0,
    }
    assert doc["checks"] == {"no_verdict_changed": True, "no_gain_lost": True}
    assert "pooled: 1 picks settled before round 3, 1 servers saved" in capsys.readouterr().out


def test_every_pick_settled_stops_the_defaults_too(bench: Any, tmp_path: Path) -> None:
    values = {5: [60.0, 61.0, 60.5], 8: [99.0, 99.5, 99.2], 0: [100.0, 100.5, 100.2]}
    out = tmp_path / "o.json"
    assert bench.main([str(_study(tmp_path, values)), "--out", str(out)]) == 0
    (s,) = json.loads(out.read_text())["studies"]
    assert s["pooled"]["servers_saved"] == 3  # both picks' third rounds and the defaults'


def test_a_study_of_two_rounds_has_no_third_to_stop(bench: Any, tmp_path: Path) -> None:
    db = _study(tmp_path, {5: [95.0, 99.0], 0: [100.0, 100.5]}, rounds=2)
    with pytest.raises(SystemExit, match="no confirm stage of 3 rounds or more"):
        bench.main([str(db), "--out", str(tmp_path / "o.json")])


def test_a_gain_settled_after_two_rounds_stops_the_stage(bench: Any, tmp_path: Path) -> None:
    """``confirm.stop_winner``: +30 % over the defaults on both first servers, 0.5 % apart: the
    stage would have stopped before round 3, every config's third server saved, the verdict the
    same. Without it (its third server 40 % down) the full verdict is no gain: a lost gain."""
    values = {8: [130.0, 130.6, 130.3], 5: [101.0, 101.5, 101.2], 0: [100.0, 100.5, 100.2]}
    out = tmp_path / "o.json"
    assert bench.main([str(_study(tmp_path, values)), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (s,) = doc["studies"]
    w = s["winner"]
    assert w["fired"] and w["servers_saved"] == 3 and w["same_verdict"] and w["still_gain"]
    assert w["verdict"] == ["gain", 8] and w["gain"][1] > 0.2
    assert s["shipped"] == w
    assert doc["summary"]["winner"]["stages_stopped"] == 1
    assert doc["summary"]["shipped"] == {"servers_saved": 3, "servers": 9}

    values[8] = [130.0, 130.6, 60.0]
    db = _study(tmp_path / "lost", values) if (tmp_path / "lost").mkdir() is None else None
    assert db is not None and bench.main([str(db), "--out", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert doc["checks"]["no_gain_lost"] is False
    assert doc["summary"]["winner"]["gains_lost"] == 1


def test_no_settled_gain_no_winner_stop(bench: Any, tmp_path: Path) -> None:
    values = {8: [104.0, 106.0, 105.0], 5: [101.0, 101.5, 101.2], 0: [100.0, 100.5, 100.2]}
    out = tmp_path / "o.json"
    assert bench.main([str(_study(tmp_path, values)), "--out", str(out)]) == 0
    (s,) = json.loads(out.read_text())["studies"]
    assert s["winner"] == {"fired": False, "servers_saved": 0} and s["shipped"] == s["pooled"]
