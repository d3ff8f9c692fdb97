"""``benchmarks/closed_loop_rate.py`` on stored capacity steps: Little's law as stored, against
completions per second while every slot is busy after the loop's first round."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_benchmark("closed_loop_rate")


def _loop(slots: int, n: int, e2e: float, first_e2e: float | None = None) -> list[dict]:
    """A closed loop's ``n`` requests, ``slots`` in flight: each slot that frees takes the next
    request of the stream, as the replay client's do; each lasts ``e2e`` s (request 0
    ``first_e2e``)."""
    free = [0.0] * slots  # when each slot frees
    rows = []
    for index in range(n):
        slot = min(range(slots), key=lambda k: free[k])
        d = first_e2e if index == 0 and first_e2e is not None else e2e
        rows.append({"index": index, "t_sent_s": free[slot], "e2e_s": d, "warmup": False})
        free[slot] += d
    return rows


def _search(folder: Path, steps: list[dict], replays: dict[int, list[dict]], **extra: Any) -> None:
    folder.mkdir(parents=True)
    (folder / "capacity.json").write_text(json.dumps({"steps": steps, "repeated": [], **extra}))
    for k, rows in replays.items():
        (folder / f"capacity_{k}").mkdir()
        text = "".join(json.dumps(r) + "\n" for r in rows)
        (folder / f"capacity_{k}" / "requests.jsonl").write_text(text)


def _step(factor: float, rps: float, held: bool = True, pruned: str | None = None) -> dict:
    return {"factor": factor, "rps": rps, "held": held, "pruned": pruned, "margin": 0.1}


def test_little_and_the_busy_window_agree_on_a_steady_loop_and_a_straggler_has_none(
    bench: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "runs" / "2026-12-06_05-00-00"
    # 4 slots, 1 s a request: 4 req/s by Little's law and by the completions between the first
    # round's end (1 s) and the last send (3 s): 8 in 2 s
    steady = _loop(4, 16, 1.0)
    # the same loop stored 10 % high, as the outlier read: the busy window says so
    high = _loop(4, 16, 1.0)
    # a first-round request still running at the last send (3 s): no all-busy window
    straggler = _loop(4, 12, 1.0, first_e2e=3.5)
    _search(
        run / "trial_0000",
        [
            _step(1.0, 2.0),
            _step(2.0, 4.0),
            _step(2.2, 4.4),
            _step(2.4, 5.0),
            _step(3.0, 6.0, False, "lost"),
        ],
        {1: steady, 2: high, 3: straggler, 4: steady},
    )
    # a search that replayed a step after a stall: its folders and steps no longer line up
    _search(
        run / "trial_0001",
        [_step(1.0, 2.0), _step(2.0, 4.0)],
        {1: steady},
        repeated=[{"factor": 2.0}],
    )
    out = tmp_path / "rate.json"
    assert bench.main([str(run), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (r,) = doc["runs"]
    assert r["steps"] == 3 and r["with_busy_window"] == 2 and r["no_busy_window"] == 1
    by = {row["factor"]: row for row in r["rows"]}
    assert by[2.0]["slots"] == 4
    assert by[2.0]["busy_rps"] == pytest.approx(4.0) and by[2.0]["busy_vs_little"] == pytest.approx(
        0
    )
    assert by[2.2]["busy_vs_little"] == pytest.approx(4.0 / 4.4 - 1)
    assert by[2.4]["busy_rps"] is None
    assert doc["busy_vs_little"]["median"] == pytest.approx((0 + 4.0 / 4.4 - 1) / 2)
    assert "all: 3 held steps" in capsys.readouterr().out


def test_a_missing_folder_is_one_line(
    bench: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.json")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_confirm_servers_against_their_configs_median_apart_after_a_pruned_step(
    bench: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config's three confirm servers read 84, 70 and 71 req/s; the 84 was set by a held step
    right after a pruned one (the simulator's listen backlog, until 2026-12-06). A config with
    one server is left out: it has no median to stand against."""
    run = tmp_path / "runs" / "2026-12-06_12-00-00"
    loop = _loop(4, 16, 1.0)
    servers = {
        1: ([_step(1.0, 50.0), _step(4.1, 70.0, False, "lost early"), _step(3.9, 84.0)], 84.0),
        2: ([_step(1.0, 50.0), _step(4.0, 70.0), _step(4.2, 90.0, False)], 70.0),
        3: ([_step(1.0, 50.0), _step(4.0, 71.0), _step(4.2, 80.0, False, "lost")], 71.0),
    }
    for rnd, (steps, cap) in servers.items():
        _search(
            run / "confirm" / "trial_0013" / f"round_{rnd}",
            steps,
            {1: loop, 2: loop},
            capacity={"capacity_rps": cap},
        )
    _search(
        run / "confirm" / "trial_0000" / "round_1",
        [_step(1.0, 50.0), _step(4.0, 69.0)],
        {1: loop},
        capacity={"capacity_rps": 69.0},
    )
    out = tmp_path / "rate.json"
    assert bench.main([str(run), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {x["server"]: x for x in doc["runs"][0]["confirm_servers"]}
    assert set(rows) == {f"trial_0013/round_{r}" for r in (1, 2, 3)}
    assert rows["trial_0013/round_1"]["after_pruned"] is True
    assert rows["trial_0013/round_1"]["vs_median"] == pytest.approx(84 / 71 - 1)
    assert not rows["trial_0013/round_3"]["after_pruned"]  # its pruned step came after
    split = doc["confirm_vs_median"]
    assert split["after_pruned"]["servers"] == 1 and split["otherwise"]["servers"] == 2
    assert split["otherwise"]["min"] == pytest.approx(70 / 71 - 1)
    assert "confirm servers, after pruned: 1" in capsys.readouterr().out
