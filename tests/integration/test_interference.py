"""``benchmarks/interference.py`` on the simulator: two servers on two simulated GPUs, one rep of
both modes. Timing is not asserted (a 12-request replay is noise); the design is: every replay
present and complete, the pinned mode's cores read back from every server thread and disjoint
between the servers, and no server process left afterwards."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from helpers.cli import FAST
from helpers.procs import marked_pids, run_benchmark

pytestmark = pytest.mark.integration


def test_interference_benchmark_on_two_simulated_gpus(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    reserve = 1 if len(cores) >= 3 else 0  # keep a core for the client where there are enough
    marker = f"interference-{uuid.uuid4().hex}"
    out = tmp_path / "interference.json"
    proc = run_benchmark(
        "interference", "--reps", "1", "--out", str(out), "--log-dir", str(tmp_path / "logs"),
        "--", "+workload=chat", *FAST, "engine.gpus=[0,1]", f"engine.cpu_reserve={reserve}",
        cwd=tmp_path, timeout=120, env={**os.environ, "TUNER_TEST_MARKER": marker},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert marked_pids(marker) == [], "a server process survived the benchmark"
    data = json.loads(out.read_text())
    setup = data["setup"]
    assert setup["cores"] == cores and setup["reps"] == 1 and setup["baseline"] is True
    plan = {int(g): c for g, c in setup["cpu_plan"].items()}
    assert sorted(plan) == [0, 1] and set(plan[0]).isdisjoint(plan[1])
    assert set(setup["argv"]) == {"A", "B"}
    for s in setup["servers"]:
        assert s["survivors"] == [] and not Path(f"/proc/{s['pid']}").exists()

    rows = data["rows"]
    assert {r["mode"] for r in rows} == {"unpinned", "pinned"}
    for mode in ("unpinned", "pinned"):
        mine = [r for r in rows if r["mode"] == mode and r["rep"] == 0]
        assert sorted((r["server"], r["run"]) for r in mine) == [
            ("A", "alone"),
            ("A", "parallel"),
            ("B", "alone"),
            ("B", "parallel"),
        ]
        a, b = (next(r for r in mine if r["run"] == "parallel" and r["server"] == s) for s in "AB")
        assert a["t_start_s"] < b["t_end_s"] and b["t_start_s"] < a["t_end_s"]  # at once
    gpu_of = {"A": 0, "B": 1}
    for r in rows:
        assert r["all_ok"] and r["requests_ok"] == r["requests"] == 12, r
        assert r["caches_reset"] is True
        assert r["output_throughput"] > 0 and r["ttft_p50_ms"] > 0
        assert r["tasks_pinned"] >= 1 and r["tasks_checked"] >= 1
        assert r["tasks_on_plan"] == r["tasks_checked"], r  # every thread read back on target
        if r["mode"] == "pinned":
            assert r["cpus_read_back"] == plan[gpu_of[r["server"]]], r
            assert r["own_cpus"] == (cores[:reserve] or cores)
        else:
            assert r["cpus_read_back"] == cores and r["own_cpus"] == cores
    pinned = {r["server"]: set(r["cpus_read_back"]) for r in rows if r["mode"] == "pinned"}
    assert pinned["A"].isdisjoint(pinned["B"])

    assert [s["mode"] for s in data["summary"]] == ["unpinned", "pinned"]
    for s in data["summary"]:
        assert s["replays"] == 4 and s["all_ok"] and s["caches_reset"]
        assert s["ratio_output_throughput"]["mean"] > 0
    assert "| pinned |" in proc.stdout and "| unpinned |" in proc.stdout
