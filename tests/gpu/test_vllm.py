"""Real vLLM on a GPU: launch the 0.5B dummy model, stream requests, tear down, classify failures.

Skipped unless NVML sees a GPU and vLLM is importable (CI has neither). On the H200 machine:
``source /tmp/stage/bin/env.sh && pytest tests/gpu``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from tuner.config import ArrivalConfig, DistConfig, WorkloadConfig
from tuner.engine.argv import build_env
from tuner.engine.process import Server, free_port, group_members
from tuner.errors import FailureReason, LaunchFailed
from tuner.replay import replay
from tuner.telemetry.gpu import gpu_memory, nvml_available
from tuner.telemetry.prom import parse_metrics
from tuner.workload import build_requests

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "qwen-0.5b-dummy"
GPU = int(os.environ.get("TUNER_TEST_GPU", "0"))  # which GPU the tests lease

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not nvml_available(), reason="no NVIDIA GPU visible through NVML"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
]


def server(tmp_path: Path, *flags: str, timeout: float = 300) -> Server:
    from tuner.config import EngineConfig

    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(MODEL),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        "m",
        "--load-format",
        "dummy",
        *flags,
    ]
    env = build_env(EngineConfig(kind="vllm", gpus=[GPU]), cache_root=tmp_path / "cache")
    return Server(
        argv,
        env=env,
        log_path=tmp_path / "server.log",
        host="127.0.0.1",
        port=port,
        startup_timeout_s=timeout,
        stop_timeout_s=20,
        health_interval_s=1.0,
    )


def wait_gpu_free(limit_gib: float = 1.0, timeout_s: float = 60) -> float:
    deadline = time.monotonic() + timeout_s
    used = 1e9
    while time.monotonic() < deadline:
        used = max(m.used_gib for m in gpu_memory([GPU]))
        if used < limit_gib:
            break
        time.sleep(1)
    return used


async def test_serve_stream_and_teardown(tmp_path: Path) -> None:
    assert wait_gpu_free() < 1.0
    w = WorkloadConfig(
        name="t",
        endpoint="chat",
        num_requests=12,
        warmup_requests=0,
        input_tokens=DistConfig(kind="uniform", low=100, high=400),
        output_tokens=DistConfig(kind="fixed", mean=32, low=1, high=64),
        system_prompt_tokens=64,
        corpus=str(ROOT / "workloads" / "corpus.txt.gz"),
    )
    requests = build_requests(w, MODEL)
    s = server(
        tmp_path, "--enforce-eager", "--gpu-memory-utilization", "0.3", "--max-model-len", "4096"
    )
    async with s as info:
        assert info.facts.kv_cache_tokens and info.facts.kv_cache_tokens > 10_000
        assert info.facts.engine_version and info.facts.engine_version.startswith("0.24")
        records = await replay(
            s.base_url,
            "m",
            requests,
            ArrivalConfig(concurrency=4),
            duration_s=120,
            request_timeout_s=60,
        )
        async with aiohttp.ClientSession() as http, http.get(f"{s.base_url}/metrics") as r:
            metrics = parse_metrics(await r.text())
    assert [r.status for r in records] == ["ok"] * 12, [r.error for r in records]
    for spec, rec in zip(requests, records, strict=True):
        assert rec.output_tokens == 32
        assert rec.prompt_tokens is not None
        assert abs(rec.prompt_tokens - spec.prompt_tokens) <= max(1, 0.01 * spec.prompt_tokens)
        assert rec.ttft_s is not None and rec.ttft_s > 0
    assert "vllm:kv_cache_usage_perc" in metrics
    assert metrics["vllm:generation_tokens_total"] >= 12 * 32
    assert s.survivors == [] and group_members(s.pgid or -1) == []
    assert wait_gpu_free() < 1.0, "GPU memory not returned after teardown"


@pytest.mark.parametrize(
    ("flags", "reasons"),
    [
        (["--max-model-len", "999999"], {FailureReason.INVALID_CONFIG}),
        (
            ["--enforce-eager", "--gpu-memory-utilization", "0.005"],
            {FailureReason.NO_KV_MEMORY, FailureReason.CUDA_OOM},
        ),
    ],
)
async def test_forced_failures_are_classified(
    tmp_path: Path, flags: list[str], reasons: set[FailureReason]
) -> None:
    s = server(tmp_path, *flags)
    t0 = time.monotonic()
    with pytest.raises(LaunchFailed) as e:
        async with s:
            pass
    assert e.value.reason in reasons, (e.value.reason, e.value.detail)
    assert time.monotonic() - t0 < 240
    assert s.survivors == []
    assert wait_gpu_free() < 1.0
