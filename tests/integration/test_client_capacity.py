"""``benchmarks/client_capacity.py --quick``: the zero-delay server, the tuner's client at 100 and
1,000 streams (zero delay and paced), the open-loop capacity ladder, the JSON and the table.
Timing is not asserted (a 2-core CI machine says nothing about the target); the plumbing is:
every request of every row completes, the percentiles are ordered, the verdicts are there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.procs import run_benchmark

pytestmark = pytest.mark.integration


def test_quick_run_writes_rows_capacity_and_verdicts(tmp_path: Path) -> None:
    out = tmp_path / "cc.json"
    # open-loop steps of 0.25 s, not --quick's 1 s (the ladder climbs x1.25 from 200 req/s to its
    # second failure, ~16 steps on 2 cores), and 8 chunks a response, not 32: the run took 26-30
    # s, 15 s with the shorter steps, 9 s with both
    proc = run_benchmark("client_capacity", "--quick", "--step-s", "0.25", "--tokens", "8",
                         "--clients", "current", "--out", str(out), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    scenarios = {r["scenario"] for r in rows}
    for s in (
        "100 streams, zero delay",
        "1000 streams, zero delay",
        "100 streams, paced 50 ms steps",
        "1000 streams, paced 50 ms steps",
    ):
        assert s in scenarios, scenarios
    assert any(s.startswith("open ") for s in scenarios)  # a rate from the capacity ladder
    for r in rows:
        assert r["client"] == "current" and r["processes"] == 1
        assert r["ok"] == r["requests"] > 0, r
        assert 0 <= r["added_p50_ms"] <= r["added_p99_ms"] <= r["added_max_ms"], r
        assert r["probe_lag_max_ms"] >= r["probe_lag_p99_ms"] >= 0, r
    assert data["capacity_req_per_s"]["current"] > 0
    for key in ("1000 streams, zero delay", "1000 streams, paced 50 ms steps"):
        verdict = data["target_1ms_p99_at_1000"][key]
        assert isinstance(verdict["holds"], bool)
        assert verdict["holds"] == (verdict["added_p99_ms"] < 1.0)
    assert not data["setup"]["cores_shared"] or data["setup"]["cpus"] < 2
    assert "highest sustained open-loop rate" in proc.stdout
    assert "target < 1 ms p99 added at 1000 streams" in proc.stdout
