"""``benchmarks/capacity_streams.py``'s streams part: per stratification block, the spread between
seeds of what a capacity step counts (no server)."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def cs() -> Any:
    return load_benchmark("capacity_streams")


def test_spreads_are_percent_of_the_mean(cs: Any) -> None:
    rows = [
        {"text_tokens": 90.0, "output_tokens": 100.0, "images": 0.0},
        {"text_tokens": 110.0, "output_tokens": 100.0, "images": 0.0},
    ]
    got = cs._spreads(rows)
    assert got["text_tokens_range_pct"] == pytest.approx(20.0)
    assert got["text_tokens_sd_pct"] == pytest.approx(100 * 14.142135 / 100, rel=1e-6)
    assert got["output_tokens_range_pct"] == 0.0
    assert "images_sd_pct" not in got  # no images: nothing to spread


def test_stratified_blocks_spread_less_than_independent_draws(cs: Any) -> None:
    import tuner.workload.lengths as lengths

    before = lengths.BLOCK
    rows = cs.stream_stats("chat", 470, [1, 16], 6)
    assert before == lengths.BLOCK  # restored
    independent, stratified = rows
    assert [r["counted"] for r in stratified["seeds"]] == [470] * 6  # the middle third
    for key in ("text_tokens_sd_pct", "output_tokens_sd_pct"):
        assert stratified[key] < independent[key] / 2, (key, stratified, independent)
