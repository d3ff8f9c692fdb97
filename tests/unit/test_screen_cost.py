"""The summary of ``benchmarks/screen_cost.py``: replays and server seconds over the servers after
the first (which no prediction can help), a server without a capacity search left out."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def sc() -> Any:
    return load_benchmark("screen_cost")


def test_the_first_server_and_a_server_without_replays_are_left_out(sc: Any) -> None:
    rows = [
        {"replays": 8.0, "server_s": 50.0},  # the first defaults' server: no prediction yet
        {"replays": 4.0, "server_s": 20.0},
        {"replays": None, "server_s": 3.0},  # a failed start: no search, its seconds count
        {"replays": 6.0, "server_s": 30.0},
    ]
    out = sc.summary(rows, 123.4)
    assert out["servers"] == 4
    assert out["median_replays_after_first"] == 5.0
    assert out["replays_after_first"] == 10.0
    assert out["server_s_after_first"] == 53.0
    assert out["wall_s"] == 123.4
