"""``benchmarks/rate_closed.py``: the candidate rule cuts a recorded search where its held rate
and the pruned step's bound first lie within ``rel_width``, and finds the packed records too."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.benchmarks import load_benchmark

from tuner.capacity import Step


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_benchmark("rate_closed")


def test_a_search_is_cut_where_the_rates_close_on_the_pruned_bound(bench: Any) -> None:
    # the H100 image_heavy defaults' server (trial 3, 2026-12-07): after 16 yes, 47 yes, 50 no
    # (pruned) the bound on 50's rate is 9.05 against 8.83 held, 2.5 % apart
    steps = [
        Step(1.0, 6.562, 0.59, True),
        Step(2.9375, 8.830, 0.142, True),
        Step(3.125, 8.274, -0.022, False, pruned="ttft"),
        Step(3.0625, 9.198, 0.223, True),
    ]
    assert bench.closes_at(steps, 0.05) == 3
    assert bench.closes_at(steps, 0.01) is None  # 2.5 % is wider than 1 %
    # the failed step ran in full: the tuner closes there already, the rule adds nothing
    full = [*steps[:2], Step(3.125, 8.9, -0.022, False), steps[3]]
    assert bench.closes_at(full, 0.05) is None


def test_the_records_are_found_packed_or_not(bench: Any) -> None:
    names = [name for name, _ in bench.recorded(bench.RUNS)]
    assert len(names) >= 89
    assert any("run.tgz:runs/2026-12-07_00-45-25/trial_0004/capacity.json" in n for n in names)
    assert any(n.endswith("capacity-a-trial1.json") for n in names)
