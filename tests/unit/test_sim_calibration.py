"""The simulator stays calibrated to the real H200 runs (docs/sim-calibration.md).

A regression guard: the bounds are what the fitted ``SpeedModel`` achieved (plus a small slack),
not the issue's target; a change to the simulator that moves a point past them fails here. The
points evaluated here are a fast subset; ``benchmarks/sim_calibration.py`` evaluates them all.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks/calibration/h200-qwen3-8b.json"


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cal() -> Any:
    return _load("sim_calibration", ROOT / "benchmarks/sim_calibration.py")


# point id -> max |sim / real - 1| per metric, as achieved by the fitted constants (+ slack)
BOUNDS: dict[str, dict[str, float]] = {
    "bench-c8": {"output_throughput": 0.11, "ttft_p50_ms": 0.14, "tpot_p50_ms": 0.14},
    "bench-c64": {"output_throughput": 0.08, "ttft_p50_ms": 0.68, "tpot_p50_ms": 0.10},
    "chat256-t0": {"output_throughput": 0.05, "ttft_p50_ms": 0.15, "tpot_p50_ms": 0.05},
    # since the floor for steps without CUDA graphs (2026-12-07; before: 0.05, 0.04, 0.05): its
    # 16-sequence mixed steps run without graphs (docs/sim-calibration.md, "Steps without CUDA
    # graphs")
    "chat256-t9": {"output_throughput": 0.10, "ttft_p50_ms": 0.12, "tpot_p50_ms": 0.14},
    "random256-defaults": {"output_throughput": 0.12, "ttft_p50_ms": 0.08, "tpot_p50_ms": 0.11},
}


def test_extraction_reproduces_the_data_file() -> None:
    script = _load("calibration_points", ROOT / "scripts/calibration_points.py")
    stored = json.loads(DATA.read_text())
    assert json.loads(json.dumps(script.build(ROOT))) == stored


def test_every_point_has_a_rebuildable_workload_and_a_measurement() -> None:
    points = json.loads(DATA.read_text())["points"]
    assert len({p["id"] for p in points}) == len(points)
    for p in points:
        assert p["workload"]["kind"] in ("tuner", "bench", "random")
        assert p["measured"].get("output_throughput", 0) > 0
        assert p["source"]


@pytest.mark.parametrize("point_id", sorted(BOUNDS))
def test_simulator_error_within_achieved_bounds(cal: Any, point_id: str) -> None:
    (case,) = cal.prepare(cal.load_points(DATA, [point_id]))
    err = cal.errors(case.point["measured"], cal.simulate(case))
    for metric, bound in BOUNDS[point_id].items():
        assert abs(err[metric]) <= bound, f"{point_id} {metric}: {err[metric]:+.1%} > ±{bound:.0%}"


def test_kv_tokens_within_target(cal: Any) -> None:
    """The memory model (tuner/memory.py) on every point with a logged KV size, all configs."""
    from tuner.memory import GPU_PROFILES, ModelShape, estimate

    shape = ModelShape.from_dir(cal.MODEL_DIR)
    for p in cal.load_points(DATA):
        real = p["measured"].get("kv_tokens")
        if real:
            got = estimate(shape, GPU_PROFILES["h200"], p["params"]).kv_tokens
            small = p["params"].get("gpu_memory_utilization", 0.92) < SMALL_GMU
            bound = KV_BOUND_SMALL_GMU if small else KV_BOUND
            assert abs(got / real - 1) <= bound, (p["id"], got, real)


KV_BOUND = 0.035
SMALL_GMU = 0.45
KV_BOUND_SMALL_GMU = 0.05
"""Below gmu 0.45 the memory model over-predicts the KV cache by +2.4 ... +4.8 % (long_docs32-t6
+4.8 %, t21 +3.6 %, the chat fp8 picks +2.9 / +3.5 %: about 1 GiB less than predicted;
docs/sim-calibration.md). Known and not refitted; the bound keeps it from getting worse."""


LONG_BOUNDS: dict[str, dict[str, float]] = {
    "long_docs32-t0": {"output_throughput": 0.08, "ttft_p50_ms": 0.16, "tpot_p50_ms": 0.09},
    "long_docs32-t4": {"output_throughput": 0.04, "ttft_p50_ms": 0.13, "tpot_p50_ms": 0.04},
}


def test_long_context_decode_and_fp8_kv(cal: Any) -> None:
    """long_docs at 32 in flight (4k-32k-token documents): the defaults and the fp8-KV trial stay
    near the real runs, and fp8 KV is faster there (real TPOT p50 75.2 -> 62.5 ms), not slower."""
    cases = cal.prepare(cal.load_points(DATA, list(LONG_BOUNDS)))
    tpot = {}
    for case in cases:
        pid = case.point["id"]
        sim = cal.simulate(case)
        err = cal.errors(case.point["measured"], sim)
        for metric, bound in LONG_BOUNDS[pid].items():
            assert abs(err[metric]) <= bound, f"{pid} {metric}: {err[metric]:+.1%} > ±{bound:.0%}"
        tpot[pid] = sim["tpot_p50_ms"]
    assert tpot["long_docs32-t4"] < tpot["long_docs32-t0"]


def test_fit_uses_scipy_nelder_mead_within_its_budget(cal: Any) -> None:
    import numpy as np

    calls: list[int] = []

    def f(x: Any) -> float:
        calls.append(1)
        return float(np.sum((x - np.array([0.5, -1.0, 2.0])) ** 2))

    res = cal.fit_constants(f, np.zeros(3), 500)
    assert res.success
    assert np.allclose(res.x, [0.5, -1.0, 2.0], atol=0.01)
    calls.clear()
    res = cal.fit_constants(f, np.zeros(3), 12)
    assert not res.success
    assert len(calls) <= 12


def test_markdown_tables_from_a_stored_fit(cal: Any) -> None:
    result = json.loads((ROOT / "benchmarks/results/sim_calibration-scipy-fit.json").read_text())
    md = cal.markdown(result)
    for row in result["fit"]["rows"]:
        assert f"| `{row['id']}` |" in md
    assert "| output tok/s | 33 |" in md
    assert "| all | 33 |" in md


# --- the H100 SXM (2026-12-05 ... 12-07): the H200's speed model, not refitted ----------------

H100_DATA = ROOT / "benchmarks/calibration/h100-qwen3-8b.json"
H100_BOUNDS: dict[str, dict[str, float]] = {
    # one server per workload and the fp8 flags, as achieved on 2026-12-07 (+3 points): tok/s
    # and TPOT p50; TTFT only on long_docs, where prefill compute sets it (at 64 and 256 in
    # flight it read -60 ... +236 % from one H100 host to the next for the same config)
    "h100-chat256-GPU-ff46172e-screen-t6": {"output_throughput": 0.07, "tpot_p50_ms": 0.05},
    "h100-chat64-GPU-ed967e78-screen-t3": {"output_throughput": 0.10, "tpot_p50_ms": 0.07},
    "h100-chat64-GPU-ed967e78-screen-t2": {"output_throughput": 0.07, "tpot_p50_ms": 0.08},
    "h100-long_docs16-GPU-04fcc77b-screen-t0": {
        "output_throughput": 0.07,
        "ttft_p50_ms": 0.11,
        "tpot_p50_ms": 0.09,
    },  # fmt: skip
    "h100-long_docs16-GPU-1271796b-screen-t4": {
        "output_throughput": 0.13,
        "ttft_p50_ms": 0.14,
        "tpot_p50_ms": 0.15,
    },  # fmt: skip
}


def test_h100_extraction_reproduces_the_data_file() -> None:
    script = _load("calibration_points", ROOT / "scripts/calibration_points.py")
    stored = json.loads(H100_DATA.read_text())
    assert json.loads(json.dumps(script.build_h100(ROOT))) == stored
    assert stored["gpu"] == "h100" and len({p["id"] for p in stored["points"]}) == 86


def test_h100_kv_tokens_within_target(cal: Any) -> None:
    """The memory model on the H100 profile: every server's logged KV tokens within ±2 %."""
    from tuner.memory import GPU_PROFILES, ModelShape, estimate

    shape = ModelShape.from_dir(cal.MODEL_DIR)
    for p in cal.load_points(H100_DATA):
        got = estimate(shape, GPU_PROFILES["h100"], p["params"]).kv_tokens
        assert abs(got / p["measured"]["kv_tokens"] - 1) <= 0.02, (p["id"], got)


def test_h100_runs_the_h200_speed_model_within_bounds(cal: Any) -> None:
    cases = cal.prepare(cal.load_points(H100_DATA, list(H100_BOUNDS)))
    assert len(cases) == len(H100_BOUNDS)
    for case in cases:
        pid = case.point["id"]
        err = cal.errors(case.point["measured"], cal.simulate(case))
        for metric, bound in H100_BOUNDS[pid].items():
            assert abs(err[metric]) <= bound, f"{pid} {metric}: {err[metric]:+.1%} > ±{bound:.0%}"
