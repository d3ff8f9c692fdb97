"""benchmarks/startup.py on the simulator: cold misses, warm hits, the study pass's warm-first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.procs import run_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~40 s: 14 simulated launches

ROOT = Path(__file__).resolve().parents[2]


def test_startup_benchmark_on_the_simulator(tmp_path: Path) -> None:
    out = tmp_path / "startup-sim.json"
    p = run_benchmark("startup", "--out", str(out), cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["gpu"] == "sim"
    cold = [r["compile_cache"] for r in data["passes"]["cold"]["launches"]]
    assert cold == ["miss", "miss", "hit", "miss"]  # gpu_memory_utilization shares the key
    assert {r["compile_cache"] for r in data["passes"]["warm"]["launches"]} == {"hit"}
    study = [r["config"] for r in data["passes"]["study"]["launches"]]
    assert study == ["block_32", "block_32", "defaults", "gmu_0.80", "defaults", "mbt_4096"]
    s = data["summary"]
    assert s["median_ready_s"] > 0 and 0 < s["startup_share"] <= 1
    assert (s["compile_cache_hits"], s["compile_cache_misses"]) == (8, 6)
    assert set(data["passes"]["cold"]["launches"][0]["phases"]) >= {"process", "ready"}


def test_the_launchers_pass_compares_preloaded_launches_with_plain_ones(tmp_path: Path) -> None:
    out = tmp_path / "startup-launchers.json"
    launchers = ["--launchers=plain,preload,preload_fork", "--repeat=2"]
    p = run_benchmark(
        "startup", "--configs=defaults", "--passes=cold,launchers", *launchers, "--out", str(out),
        cwd=ROOT,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    whole = json.loads(out.read_text())
    # preload's and preload_fork's (its own environment), each started before the timed
    # launches and the one they fork from: a launch on another key would have started a third
    assert len(whole["zygote_import_s"]) == 2
    for n in ("preload", "preload_fork"):
        assert f"  {n}: zygote ready, its imports took" in p.stdout
    timed = p.stdout[p.stdout.index("launchers pass") :]
    assert timed.index("preload_fork: zygote ready") < timed.index("defaults   plain")
    data = whole["passes"]["launchers"]
    order = [(r["config"], r["launcher"]) for r in data["launches"]]
    assert order == [("defaults", n) for n in ("plain", "preload", "preload_fork")] * 2
    assert {r["compile_cache"] for r in data["launches"]} == {"hit"}  # the cold pass's cache
    ratios = data["by_launcher"]
    assert ratios["plain"]["median_ready_s_vs_plain"] == 1.0
    assert (
        ratios["preload"]["median_ready_s"] > 0 and "median_ready_s_vs_plain" in ratios["preload"]
    )
    assert "preload      median ready" in p.stdout
