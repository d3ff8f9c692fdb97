"""``benchmarks/interval_coverage.py``: the candidate interval over machines is Welch's on one,
and the coverage it counts falls where the pooled spread's assumption is broken."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.benchmarks import load_benchmark

from tuner.verdict import gain


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_benchmark("interval_coverage")


def test_the_candidate_over_machines_is_welch_s_interval_on_one(bench: Any) -> None:
    lever = [("m", 1.0), ("m", 1.1), ("m", 1.05)]
    base = [("m", 0.9), ("m", 0.95), ("m", 0.97), ("m", 0.92)]
    w = bench.welch_blocks(lever, base, floor=0.0)
    g = gain([v for _, v in lever], [v for _, v in base], higher=True)
    assert (w.value, w.low, w.high) == pytest.approx((g.value, g.low, g.high), rel=1e-9)


def test_one_lever_server_covers_only_when_its_spread_is_the_defaults(bench: Any) -> None:
    one = next(d for d in bench.DESIGNS if d.name == "screen 1 + 5")
    equal, wider = (
        next(n for n in bench.NOISES if n.name.startswith(w)) for w in ("equal, 2", "lever")
    )
    assert bench.measure(one, equal, "shipped", reps=400, seed=1).coverage > 0.92
    hit = bench.measure(one, wider, "shipped", reps=400, seed=1)
    assert hit.coverage < 0.85 and hit.false_gain > 0.05
