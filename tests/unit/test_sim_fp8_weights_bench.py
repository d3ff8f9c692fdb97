"""``benchmarks/sim_fp8_weights.py``: the real fp8/defaults ratios it fits the simulator to, read
from the stored H200 runs, and the simulator's at the kept constant (docs/sim-calibration.md)."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.benchmarks import load_benchmark

from tuner.sim.engine import FP8_GEMM_SPEEDUP


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_benchmark("sim_fp8_weights")


def test_the_real_ratios_come_from_the_stored_servers(bench: Any) -> None:
    points = bench.real_points()
    # at 256 in flight every server of both arms held; at 384 one fp8 server and 3 defaults' did
    assert {f: {a: p["servers"] for a, p in arms.items()} for f, arms in points.items()} == {
        1.0: {"trial0": 3.0, "trial1": 3.0},
        1.5: {"trial0": 3.0, "trial1": 1.0},
    }
    real = bench.ratios(points)
    assert real[1.0]["tpot_p50_ms"] == pytest.approx(0.786, abs=0.001)
    assert real[1.0]["output_throughput"] == pytest.approx(1.195, abs=0.001)
    assert real[1.5]["output_throughput"] == pytest.approx(1.154, abs=0.001)


def test_the_kept_constant_fits_better_than_weight_bytes_alone(bench: Any) -> None:
    real = bench.ratios(bench.real_points())
    st = bench.steps()
    kept = bench.loss(real, bench.ratios(bench.simulate(st, FP8_GEMM_SPEEDUP)))
    bytes_only = bench.loss(real, bench.ratios(bench.simulate(st, 1.0)))
    assert kept < 0.01 < bytes_only
