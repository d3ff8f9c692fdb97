"""Two studies started from two working directories share one compile cache (engine.cache_root):
the second finds the first's compiled config warm, launches it first, and its log says hit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli import FAST, tuner

pytestmark = pytest.mark.integration


def _launch(cwd: Path, number: int) -> tuple[dict, dict]:
    result = next((cwd / "outputs" / "runs").glob(f"*/trial_{number:04d}/result.json"))
    data = json.loads(result.read_text())
    return data["params"], data["launch"]["startup"]


def test_two_studies_share_the_compile_cache_and_launch_warm_keys_first(tmp_path: Path) -> None:
    cache = tmp_path / "shared-cache"
    common = [
        "+workload=chat",
        "engine=sim",
        f"engine.cache_root={cache}",
        "study.baseline_first=false",
        "confirm.enabled=false",
        "tracking=none",  # the cache is what is tested (MLflow took ~5 s of each run)
        # off in the default space; neither is in vLLM's compile key
        "space.params.gpu_memory_utilization.enabled=true",
        "space.params.max_num_seqs.enabled=true",
        *FAST,
    ]
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    # not vLLM's defaults: a trial at them is a baseline trial, launched without the searched
    # flags, whose predicted key is not that of the same values passed explicitly
    p = tuner(first, *common, "study.n_trials=1", "study.enqueue=[{gpu_memory_utilization:0.85}]")
    assert p.returncode == 0, p.stderr[-3000:]
    params, startup = _launch(first, 0)
    assert startup["compile_cache"] == "miss" and startup["compile_hash"]
    assert (cache / "torch_compile_cache" / startup["compile_hash"]).is_dir()
    assert "Start-up (simulated): median ready" in p.stdout + p.stderr
    # the second study: a cold config enqueued first, then one with the first's compile key
    # (gpu_memory_utilization is not in vLLM's key): the warm one runs first
    p = tuner(
        second,
        *common,
        "study.n_trials=2",
        "study.enqueue=[{max_num_seqs:64},{gpu_memory_utilization:0.8}]",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    params0, startup0 = _launch(second, 0)
    params1, startup1 = _launch(second, 1)
    assert params0["gpu_memory_utilization"] == 0.8 and startup0["compile_cache"] == "hit"
    assert startup0["compile_hash"] == startup["compile_hash"]
    assert params1["max_num_seqs"] == 64 and startup1["compile_cache"] == "miss"
    assert startup1["compile_hash"] != startup["compile_hash"]
    assert "compile cache 1 hit(s), 1 miss(es)" in p.stdout + p.stderr
    assert not (second / "outputs" / "state" / "vllm_cache").exists()
