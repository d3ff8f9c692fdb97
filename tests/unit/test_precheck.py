from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import FailureReason, TrialFailed
from tuner.memory import GPU_PROFILES, ModelShape, estimate
from tuner.precheck import precheck
from tuner.records import RequestSpec

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ModelShape.from_dir(ROOT / "models" / "qwen3-8b-dummy")  # 32 attention heads
DEFAULTS = {
    "gpu_memory_utilization": 0.92,
    "max_model_len": 40960,
    "block_size": 16,
    "max_num_seqs": 1024,
    "max_num_batched_tokens": 8192,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "enforce_eager": False,
    "cudagraph_mode": "FULL_AND_PIECEWISE",
    "kv_cache_dtype": "auto",
}


def spec(n: int) -> RequestSpec:
    return RequestSpec(index=0, endpoint="chat", body={}, prompt_tokens=n, output_tokens=100)


@pytest.mark.parametrize(
    ("gpus", "params", "needle"),
    [
        ([0], {"tensor_parallel_size": 2}, "exceeds the GPU lease"),
        ([0, 1, 2], {"tensor_parallel_size": 3}, "does not divide the 32"),
        ([0], {"max_model_len": 4096}, "max_model_len 4096 is shorter"),
    ],
)
def test_tuner_limits_always_apply(make_cfg, gpus, params, needle) -> None:
    cfg = make_cfg("+workload=chat", f"engine.gpus={gpus}")
    for veto in (True, False):
        with pytest.raises(TrialFailed) as e:
            precheck(cfg, SHAPE, {**DEFAULTS, **params}, [spec(8000), spec(300)] * 5, veto=veto)
        assert e.value.reason is FailureReason.PRECHECK
        assert needle in e.value.detail


def test_h200_reference_points(make_cfg) -> None:
    """shared/device/README.md: defaults start (814,368 KV tokens logged); gmu 0.12 fails; the
    GPU run of 2026-11-30: gmu 0.15 at max_model_len 40960 fails (4.5 GiB KV < 5.62 needed)."""
    cfg = make_cfg("+workload=chat")
    ok = precheck(cfg, SHAPE, DEFAULTS, [])
    assert ok.kv_tokens == pytest.approx(814_368, rel=0.02)
    for gmu in (0.12, 0.15):
        with pytest.raises(TrialFailed) as e:
            precheck(cfg, SHAPE, {**DEFAULTS, "gpu_memory_utilization": gmu}, [])
        assert e.value.reason in (FailureReason.NO_KV_MEMORY, FailureReason.KV_TOO_SMALL)
        assert e.value.detail.startswith("predicted before launch: ")
    # veto off: predicted, not rejected (the trial launches and vLLM refuses)
    v = precheck(cfg, SHAPE, {**DEFAULTS, "gpu_memory_utilization": 0.12}, [], veto=False)
    assert v.kv_tokens == 0


def test_borderline_configs_still_launch(make_cfg) -> None:
    """A predicted KV-too-small within the model's error margin is launched, not vetoed."""
    cfg = make_cfg("+workload=chat")
    gpu = GPU_PROFILES["h200"]
    # find the gmu where the predicted KV just falls short of one 40960-token request
    gmu = 0.20
    while estimate(SHAPE, gpu, {**DEFAULTS, "gpu_memory_utilization": gmu}).failure is None:
        gmu -= 0.001
    est = estimate(SHAPE, gpu, {**DEFAULTS, "gpu_memory_utilization": gmu})
    assert est.failure is FailureReason.KV_TOO_SMALL
    v = precheck(cfg, SHAPE, {**DEFAULTS, "gpu_memory_utilization": gmu}, [])
    assert v.kv_tokens == 0  # predicted to fail, but within the margin: launch and see


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 2048}, "smaller than"),
        ({"max_num_seqs": 1024, "max_num_batched_tokens": 512}, "greater than or equal"),
    ],
)
def test_vllm_validation_rules(make_cfg, params, needle) -> None:
    cfg = make_cfg("+workload=chat")
    with pytest.raises(TrialFailed) as e:
        precheck(cfg, SHAPE, {**DEFAULTS, **params}, [])
    assert e.value.reason is FailureReason.INVALID_CONFIG
    assert needle in e.value.detail
    # the baseline passes no flag: vLLM's rules for user-set values do not apply
    precheck(cfg, SHAPE, {**DEFAULTS, **params}, [], baseline=True)
