"""``benchmarks/replay_vs_vllm_bench.py --quick``: the tuner's client and ``vllm bench serve``
against the simulator, one pair. Skipped where vLLM's CLI is not installed (``$TUNER_VLLM_CLI`` or
``vllm`` on ``PATH``). Closed loop at 4 in flight, and open loop on vllm's Poisson schedule at 8
requests/s. Timing is not asserted (a 16-request run is noise); the plumbing is: both
clients complete every request, the server saw the same token counts from both, the JSON and the
table are written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers.procs import run_benchmark

pytestmark = pytest.mark.integration
VLLM = os.environ.get("TUNER_VLLM_CLI") or shutil.which("vllm")


@pytest.mark.skipif(VLLM is None, reason="vllm CLI not installed (set TUNER_VLLM_CLI)")
@pytest.mark.parametrize("load", [[], ["--rate", "8", "--burstiness", "1"]], ids=["c4", "r8-b1"])
def test_quick_pair_against_the_simulator(tmp_path: Path, load: list[str]) -> None:
    assert VLLM is not None
    out = tmp_path / "rvb.json"
    proc = run_benchmark(
        "replay_vs_vllm_bench", "--quick", *load, "--sim-speedup", "5", "--vllm", VLLM,
        "--out", str(out), cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["setup"]["quick"] is True and data["setup"]["fresh_server_per_run"] is True
    runs = data["runs"]
    assert sorted(r["client"] for r in runs) == ["ours", "vllm"]
    for r in runs:
        assert r["completed"] == 16 and r["failed"] == 0, r
        assert r["output_throughput"] > 0 and r["ttft_p50_ms"] > 0 and r["tpot_p50_ms"] > 0
    (summary,) = data["summary"]
    assert summary["identical_token_counts"] is True
    assert summary["all_requests_ok"] is True
    for key in ("output_throughput", "ttft_p50_ms", "tpot_p50_ms"):
        assert summary["ratios"][key]["mean"] > 0
    assert isinstance(data["holds"], bool)
    assert "| tuner/vllm |" in proc.stdout
    if load:  # open loop: both clients sent on vllm's Poisson schedule (2-core machine: loose)
        assert summary["load"] == "r8-b1" and summary["rate"] == 8.0
        for r in runs:
            assert r["concurrency"] is None and r["rate"] == 8.0 and r["burstiness"] == 1.0
            assert 0.0 <= r["send_lag_max_ms"] < 100.0, r
    else:
        assert summary["load"] == "c4" and summary["concurrency"] == 4
