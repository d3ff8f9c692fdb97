"""``benchmarks/climb_rules.py`` on a stored search: its model replays the stored steps under the
narrow rule, and a clear winner climbs in fewer replays by its margin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.benchmarks import load_benchmark

# a quick start's incumbent (trial 11) and its fp8 trial 16 (2026-12-06, /tmp/qs1 at 614115d):
# (factor, rps, margin, held) of each step, as capacity.json stored them
INCUMBENT = {"capacity_rps": 70.0228, "capacity_factor": 8.256, "capacity_censored": 0.0}
WINNER = [
    (1.0, 50.3, 0.8188, True),
    (8.2656, 86.43, 0.1369, True),
    (8.6406, 88.64, 0.1249, True),
    (9.0312, 87.31, 0.0689, True),
    (9.875, 87.93, 0.0201, True),
    (11.7812, 112.1, -0.8802, False),
    (10.8281, 105.16, -0.0226, False),
    (10.3594, 88.19, 0.0179, True),
]


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_benchmark("climb_rules")


def _trial(run: Path, n: int, steps: list[tuple[float, float, float, bool]], cap: dict) -> None:
    folder = run / f"trial_{n:04d}"
    folder.mkdir(parents=True)
    rows = [{"factor": f, "rps": r, "margin": m, "held": h} for f, r, m, h in steps]
    (folder / "capacity.json").write_text(json.dumps({"capacity": cap, "steps": rows}))


def test_the_model_replays_the_stored_search_and_a_clear_winner_climbs_by_its_margin(
    bench: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "runs" / "2026-12-06_10-21-56"
    _trial(run, 11, [(1.0, 40.0, 0.77, True), (8.256, 70.0, 0.01, True)], INCUMBENT)
    _trial(run, 16, WINNER, {"capacity_rps": 89.95, "capacity_factor": 10.57})
    # a trial that lost at the incumbent's load does not count (no climb)
    _trial(run, 17, [(1.0, 40.0, 0.7, True), (8.256, 60.0, -0.3, False)], {"capacity_rps": 50.0})
    out = tmp_path / "climb.json"
    assert bench.main([str(run), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["runs"][0]["climbs"]
    assert row["trial"] == "trial_0016" and row["incumbent"] == pytest.approx(70.0228)
    assert row["narrow"]["replays"] == len(WINNER)  # the model's check: the stored 8
    assert row["narrow"]["capacity"] == pytest.approx(89.95, rel=0.02)
    assert row["by_margin_when_clear"]["replays"] < len(WINNER)
    assert row["by_margin_when_clear"]["capacity"] == pytest.approx(89.95, rel=0.03)
    assert "by margin when clear" in capsys.readouterr().out
    # the rule is back as it was
    from tuner import capacity

    assert capacity._clear_winner.__name__ == "_clear_winner"


def test_a_missing_folder_is_one_line(bench: Any, tmp_path: Path) -> None:
    assert bench.main([str(tmp_path / "nowhere")]) == 2
