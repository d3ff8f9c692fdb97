"""The memory model against real vLLM 0.24 numbers on an H200 (Qwen3-8B), and its failure texts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tuner.errors import FailureReason
from tuner.memory import (
    GPU_PROFILES,
    VLLM_DEFAULTS,
    GiB,
    ModelShape,
    estimate,
    kv_bytes_per_token,
    resolve_params,
)

ROOT = Path(__file__).resolve().parents[2]
H200 = GPU_PROFILES["h200"]


@pytest.fixture(scope="module")
def qwen8b() -> ModelShape:
    return ModelShape.from_dir(ROOT / "models" / "qwen3-8b-dummy")


@pytest.fixture(scope="module")
def qwen05b() -> ModelShape:
    return ModelShape.from_dir(ROOT / "models" / "qwen-0.5b-dummy")


def test_shape_from_config(qwen8b: ModelShape, qwen05b: ModelShape) -> None:
    assert (qwen8b.num_layers, qwen8b.num_kv_heads, qwen8b.head_dim) == (36, 8, 128)
    assert qwen8b.dtype_bytes == 2 and not qwen8b.tie_word_embeddings
    assert qwen8b.max_position_embeddings == 40960
    # Published sizes: Qwen3-8B 8.19e9 parameters, Qwen2.5-0.5B 0.494e9 (tied embeddings).
    assert qwen8b.param_count == pytest.approx(8.19e9, rel=0.005)
    assert qwen05b.param_count == pytest.approx(0.494e9, rel=0.01)
    assert qwen05b.head_dim == 896 // 14 and qwen05b.tie_word_embeddings
    # vLLM logged "Model loading took 15.27 GiB" for Qwen3-8B.
    assert qwen8b.weight_bytes / GiB == pytest.approx(15.27, abs=0.05)


def test_kv_bytes_per_token(qwen8b: ModelShape) -> None:
    assert kv_bytes_per_token(qwen8b, "auto", 1) == 147_456
    assert kv_bytes_per_token(qwen8b, "auto", 2) == 147_456 // 2
    assert kv_bytes_per_token(qwen8b, "fp8", 1) == 147_456 // 2
    assert kv_bytes_per_token(qwen8b, "fp8_e5m2", 2) == 147_456 // 4


@pytest.mark.parametrize(
    ("params", "real_tokens"),
    [
        pytest.param({}, 814_368, id="defaults"),
        pytest.param({"enforce_eager": True}, 816_640, id="enforce-eager"),
        pytest.param({"gpu_memory_utilization": 0.30}, 185_488, id="gmu-0.30"),
        pytest.param({"tensor_parallel_size": 2}, 1_739_792, id="tp-2"),
        # online fp8 weights: 2 servers logged this (docs/gpu-runs/2026-12-02-screen-fp8.md);
        # the bf16 weights' 817,184 is 5 % under it
        pytest.param({"quantization": "fp8"}, 861_024, id="fp8-weights"),
    ],
)
def test_calibration_points(qwen8b: ModelShape, params: dict, real_tokens: int) -> None:
    est = estimate(qwen8b, H200, params)
    assert est.failure is None
    assert est.kv_tokens == pytest.approx(real_tokens, rel=0.02)
    assert est.kv_tokens % 16 == 0
    assert est.max_concurrency == pytest.approx(est.kv_tokens / 40960)


@pytest.mark.parametrize(
    ("params", "real_tokens"),
    [  # vLLM 0.24 on the H200, 2026-11-30 (docs/gpu-runs/2026-11-30-h200.md)
        pytest.param({}, 10_918_288, id="defaults"),
        pytest.param({"enforce_eager": True}, 10_949_872, id="enforce-eager"),
        pytest.param(
            {"gpu_memory_utilization": 0.5, "max_num_batched_tokens": 2048},
            5_788_496,
            id="gmu-0.5-mnbt-2048",
        ),
    ],
)
def test_calibration_points_qwen2_05b(qwen05b: ModelShape, params: dict, real_tokens: int) -> None:
    est = estimate(qwen05b, H200, params)
    assert est.failure is None
    assert est.kv_tokens == pytest.approx(real_tokens, rel=0.005)


def test_calibration_point_qwen3_vl_8b() -> None:
    """vLLM 0.24, Qwen3-VL-8B shape, defaults on the H200 (docs/gpu-runs/2026-11-30-h200x2-studies.md):
    'GPU KV cache size: 787,488 tokens' (the overhead was fitted on this point)."""
    shape = ModelShape.from_dir(ROOT / "models" / "qwen3-vl-8b-dummy")
    est = estimate(shape, H200, {})
    assert est.failure is None and est.max_model_len == 262_144
    assert est.kv_tokens == pytest.approx(787_488, rel=0.005)


def test_graphs_cost_memory_and_eager_gets_more_kv(qwen8b: ModelShape) -> None:
    graphs = estimate(qwen8b, H200, {})
    eager = estimate(qwen8b, H200, {"enforce_eager": True})
    assert graphs.cudagraph_gib > 0 and eager.cudagraph_gib == 0
    assert eager.kv_tokens > graphs.kv_tokens
    small = estimate(qwen8b, H200, {"max_cudagraph_capture_size": 64})
    assert 0 < small.cudagraph_gib < graphs.cudagraph_gib
    piecewise = estimate(qwen8b, H200, {"cudagraph_mode": "PIECEWISE"})
    assert 0 < piecewise.cudagraph_gib < graphs.cudagraph_gib


def test_activation_grows_with_batch_knobs(qwen8b: ModelShape) -> None:
    base = estimate(qwen8b, H200, {})
    more_tokens = estimate(qwen8b, H200, {"max_num_batched_tokens": 32768})
    fewer_seqs = estimate(qwen8b, H200, {"max_num_seqs": 128})
    assert more_tokens.activation_gib > base.activation_gib
    assert fewer_seqs.activation_gib < base.activation_gib
    assert more_tokens.kv_tokens < base.kv_tokens


def test_gmu_012_has_no_kv_memory(qwen8b: ModelShape) -> None:
    est = estimate(qwen8b, H200, {"gpu_memory_utilization": 0.12})
    assert est.failure is FailureReason.NO_KV_MEMORY
    assert est.kv_tokens == 0 and est.kv_gib <= 0
    assert est.message is not None
    assert est.message.startswith(
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine (this flag also controls CPU memory reservation on the CPU "
        "backend, despite its name)."
    )


def test_weights_over_budget_is_no_kv_memory(qwen8b: ModelShape) -> None:
    est = estimate(qwen8b, H200, {"gpu_memory_utilization": 0.05})
    assert est.failure is FailureReason.NO_KV_MEMORY


def test_kv_too_small_exact_message(qwen8b: ModelShape) -> None:
    # At gmu 0.13 the KV cache (~1.3 GiB) cannot hold one 40,960-token request (5.62 GiB).
    est = estimate(qwen8b, H200, {"gpu_memory_utilization": 0.13, "max_model_len": 40960})
    assert est.failure is FailureReason.KV_TOO_SMALL
    kv_bytes = est.kv_gib * GiB
    needed = 40960 * 147_456
    estimated_len = math.floor(kv_bytes / (16 * 147_456)) * 16
    assert 0 < estimated_len < 40960
    expected = (
        "To serve at least one request with the model's max seq len (40960), "
        f"({round(needed / GiB, 2)} GiB KV cache is needed, which is larger than the available "
        f"KV cache memory ({round(kv_bytes / GiB, 2)} GiB). Based on the available memory, the "
        f"estimated maximum model length is {estimated_len}. Try increasing "
        "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
        "decreasing `max_model_len` when initializing the engine. See "
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    )
    assert est.message == expected
    assert "(5.62 GiB KV cache is needed" in expected


def test_kv_too_small_without_estimate_sentence(qwen8b: ModelShape) -> None:
    est = estimate(qwen8b, H200, {"kv_cache_memory_bytes": 1000})
    assert est.failure is FailureReason.KV_TOO_SMALL
    assert est.message is not None and "Based on the available memory" not in est.message


def test_gmu_020_fits_a_shorter_context(qwen8b: ModelShape) -> None:
    assert estimate(qwen8b, H200, {"gpu_memory_utilization": 0.2}).ok
    est = estimate(qwen8b, H200, {"gpu_memory_utilization": 0.13, "max_model_len": 8192})
    assert est.ok and est.kv_tokens >= 8192


def test_tp_halves_per_gpu_bytes(qwen8b: ModelShape) -> None:
    one = estimate(qwen8b, H200, {})
    two = estimate(qwen8b, H200, {"tensor_parallel_size": 2})
    assert two.bytes_per_token * 2 == one.bytes_per_token
    assert two.weights_gib == pytest.approx(one.weights_gib / 2)
    assert two.kv_tokens > 2 * one.kv_tokens


def test_fp8_kv_doubles_tokens(qwen8b: ModelShape) -> None:
    auto = estimate(qwen8b, H200, {})
    fp8 = estimate(qwen8b, H200, {"kv_cache_dtype": "fp8"})
    assert fp8.kv_tokens == pytest.approx(2 * auto.kv_tokens, rel=0.001)


def test_block_size_rounds_tokens(qwen8b: ModelShape) -> None:
    est = estimate(qwen8b, H200, {"block_size": 128})
    assert est.kv_tokens % 128 == 0
    assert est.kv_tokens == pytest.approx(estimate(qwen8b, H200, {}).kv_tokens, rel=0.001)


def test_defaults_follow_vllm(qwen8b: ModelShape) -> None:
    r = resolve_params(qwen8b, H200, {})
    assert (r.max_num_seqs, r.max_num_batched_tokens, r.max_model_len) == (1024, 8192, 40960)
    assert r.cudagraph_mode == "FULL_AND_PIECEWISE" and max(r.capture_sizes) == 512
    off = resolve_params(qwen8b, H200, {"enable_chunked_prefill": False})
    assert off.max_num_batched_tokens == 40960
    small = resolve_params(qwen8b, H200, {"max_num_batched_tokens": 512})
    assert small.max_num_seqs == 512  # defaulted max_num_seqs is clamped to the token budget
    thr = resolve_params(qwen8b, H200, {"performance_mode": "throughput"})
    assert (thr.max_num_seqs, thr.max_num_batched_tokens) == (2048, 16384)
    eager = resolve_params(qwen8b, H200, {"enforce_eager": True, "cudagraph_mode": "FULL"})
    assert eager.cudagraph_mode == "NONE" and eager.capture_sizes == ()


def test_the_spaces_state_vllms_defaults(qwen8b: ModelShape) -> None:
    """Every ``default`` of ``conf/space/*.yaml`` that vLLM fixes is :data:`VLLM_DEFAULTS`' value
    (gpu_memory_utilization 0.92 included), and the derived ones are what ``resolve_params`` gives
    on the H200 with nothing passed (max_num_seqs 1024, max_num_batched_tokens 8192, ...)."""
    derived = resolve_params(qwen8b, H200, {})
    checked = set()
    for path in sorted((ROOT / "conf" / "space").glob("*.yaml")):
        tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        assert isinstance(tree, dict)
        for name, spec in (tree.get("params") or {}).items():
            if "default" not in spec:  # an override of another option's spec (enabled: true)
                continue
            if name in VLLM_DEFAULTS:
                assert spec["default"] == VLLM_DEFAULTS[name], f"{path.name}: {name}"
                checked.add(name)
            elif name in ("max_num_seqs", "max_num_batched_tokens", "cudagraph_mode"):
                assert spec["default"] == getattr(derived, name), f"{path.name}: {name}"
                checked.add(name)
    assert VLLM_DEFAULTS["gpu_memory_utilization"] == 0.92
    assert {"gpu_memory_utilization", "block_size", "max_num_seqs"} <= checked


def test_auto_max_model_len_fits(qwen8b: ModelShape) -> None:
    est = estimate(qwen8b, H200, {"gpu_memory_utilization": 0.13, "max_model_len": -1})
    assert est.ok and 0 < est.max_model_len < 40960
