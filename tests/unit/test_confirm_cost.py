"""The pure parts of ``benchmarks/confirm_cost.py``: each confirm server's replays, start and
capacity read from a run folder, the servers after each pick's first, the two modes compared per
pick; and its patch, which must reach the function the study calls."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def cc() -> Any:
    return load_benchmark("confirm_cost")


def _run(tmp: Path, servers: dict[int, list[tuple[list[float], float]]]) -> Path:
    """A run folder with confirm.json and each server's capacity.json: per trial, per round, its
    steps' factors (the first is the stress replay) and its capacity."""
    run = tmp / "outputs" / "runs" / "2026-12-05_00-00-00"
    cands = []
    for trial, rounds in servers.items():
        censored = -1.0 if trial == 7 else 0.0
        cands.append({"trial": trial, "picks": ["latency" if trial == 7 else "baseline"],
                      "search_metrics": {"capacity_censored": censored}})  # fmt: skip
        for r, (factors, rps) in enumerate(rounds, start=1):
            d = run / "confirm" / f"trial_{trial:04d}" / f"round_{r}"
            d.mkdir(parents=True)
            steps = [{"factor": f, "held": True} for f in factors]
            cap = {"capacity_rps": rps, "capacity_censored": 0.0}
            (d / "capacity.json").write_text(json.dumps({"capacity": cap, "steps": steps}))
    verdict = {"kind": "gain", "recommended": 7, "gains": {}}
    (run / "confirm.json").write_text(json.dumps({"candidates": cands, "verdict": verdict}))
    return tmp


def test_servers_after_each_picks_first_and_the_comparison(cc: Any, tmp_path: Path) -> None:
    far = _run(tmp_path / "search", {
        7: [([1, 3.6, 3.4, 3.0, 2.6, 2.4, 2.5, 2.55], 64.0)] * 3,
        0: [([1, 3.6, 3.5], 69.0), ([1, 3.6, 3.5], 70.0), ([1, 3.6, 3.7], 68.0)],
    })  # fmt: skip
    near = _run(tmp_path / "earlier", {
        7: [([1, 3.6, 3.4, 3.0, 2.6, 2.4, 2.5, 2.55], 64.0), ([1, 2.5, 2.6], 65.0),
            ([1, 2.5, 2.4], 63.0)],
        0: [([1, 3.6, 3.5], 69.0), ([1, 3.55, 3.7], 69.5), ([1, 3.55, 3.4], 68.5)],
    })  # fmt: skip
    a, b = cc.read_confirm(far), cc.read_confirm(near)
    assert a["verdict"] == {"kind": "gain", "recommended": 7, "gains": {}}
    (p7, p0) = b["picks"]
    assert p7["search_censored"] and not p0["search_censored"]
    assert [s["replays"] for s in p7["servers"]] == [8, 3, 3]
    assert [s["start"] for s in p7["servers"]] == [3.6, 2.5, 2.5]
    assert cc.later_replays(a["picks"]) == [8, 8, 3, 3]
    assert cc.later_replays(b["picks"]) == [3, 3, 3, 3]
    rows = cc.compare(a, b)
    assert [r["trial"] for r in rows] == [7, 0]
    assert rows[0]["diff"] == pytest.approx(0.0) and rows[0]["within"]
    assert rows[0]["spread"] == pytest.approx(2.0 / 64.0)  # 63 … 65 over all six servers
    moved = cc.compare(a, cc.read_confirm(_run(tmp_path / "moved", {
        7: [([1, 2.5, 2.6], 70.0)] * 3, 0: [([1, 3.6, 3.5], 69.0)] * 3,
    })))  # fmt: skip
    # 64 x 3 against 70 x 3: +9.4 %, beyond their spread, (70 - 64) / 67 = 9.0 %
    assert moved[0]["diff"] == pytest.approx(6.0 / 64.0) and not moved[0]["within"]


def test_the_patch_reaches_the_start_the_study_calls(cc: Any, monkeypatch: Any) -> None:
    # the benchmark's "search" mode: the study's capacity_start ignores the earlier servers
    # (runpy stubbed: the tuner does not run)
    import tuner.confirm
    import tuner.confirm_stage
    from tuner.config import ConfirmConfig, TunerConfig
    from tuner.records import Candidate, TrialResult

    ran: list[str] = []
    monkeypatch.setattr(runpy, "run_module", lambda name, **kw: ran.append(name))
    monkeypatch.setattr(sys, "argv", ["-c", "+workload=chat"])
    monkeypatch.setattr(
        tuner.confirm_stage, "capacity_start", tuner.confirm_stage.capacity_start
    )  # restored
    exec(compile(cc._SEARCH_START, "confirm_cost", "exec"), {})
    assert ran == ["tuner"] and sys.argv == ["tuner", "+workload=chat"]
    pick = Candidate(
        3, ("capacity",), {}, False, (), {"capacity_factor": 8.0, "capacity_rps": 70.0}
    )
    cfg = TunerConfig(confirm=ConfirmConfig(load_factor=2.0))
    m = {"capacity_factor": 3.6, "capacity_rps": 69.0, "capacity_censored": 0.0}
    earlier = [TrialResult(3, {}, (), (69.0,), {}, m)]
    assert tuner.confirm.capacity_start(pick, cfg, earlier).factor == 3.6  # as shipped
    assert tuner.confirm_stage.capacity_start(pick, cfg, earlier).factor == 4.0  # the search's, / 2
