"""scripts/sim_sweep.py: the simulator's prediction for a grid of flags, per request stream."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "sim_sweep.py"
SMALL = [
    "+workload=chat",
    "workload.num_requests=30",
    "workload.arrival.concurrency=8",
    "workload.output_tokens.low=8",
    "workload.output_tokens.high=16",
]


def sweep(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_every_config_and_seed_is_a_row(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    p = sweep(
        "--grid", "max_num_seqs=4,64", "--grid", "gpu_memory_utilization=0.05,0.9",
        "--seeds", "0", "1", "--out", str(out), "--", *SMALL,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == (1 + 2 * 2) * 2  # the defaults plus the grid, per seed
    assert {r["seed"] for r in rows} == {0, 1}
    starved = [r for r in rows if r["params"].get("gpu_memory_utilization") == 0.05]
    assert starved and all(not r["feasible"] and r["failure"] for r in starved)
    assert "does not start" in p.stdout
    ok = [r for r in rows if r["params"] == {"max_num_seqs": 64, "gpu_memory_utilization": 0.9}]
    assert all(r["feasible"] and r["goodput"] > 0 for r in ok)


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    p = sweep("--grid", "max_num_seqs", "--", *SMALL)
    assert p.returncode != 0 and "expected NAME=V1,V2" in p.stderr
    p = sweep("--grid", "no_such_flag=1", "--", *SMALL)
    assert p.returncode != 0 and "--grid names ['no_such_flag']" in p.stderr
    p = sweep("--", *SMALL, "workload.arrival.kind=poisson", "workload.arrival.rate=3")
    assert p.returncode != 0 and "allowed: concurrency" in p.stderr
