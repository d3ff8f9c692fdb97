"""vLLM 0.24's config rules (tuner.vllm_rules): each rule, its exact text, and vLLM's order."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tuner.errors import FailureReason
from tuner.memory import GPU_PROFILES, ModelShape, resolve_params
from tuner.sim.cli import parse_args
from tuner.sim.startup import Refusal, engine_check, resolve
from tuner.vllm_rules import (
    BLOCK_SIZE_NOT_SUPPORTED,
    KV_CACHE_DTYPE_NOT_SUPPORTED,
    Rule,
    Violation,
    api_refusal,
    argument_refusal,
    backend_refusal,
    block_size_supported,
    refusal,
    scheduler_refusal,
)

ROOT = Path(__file__).resolve().parents[2]
QWEN8B = ROOT / "models" / "qwen3-8b-dummy"
SHAPE = ModelShape.from_dir(QWEN8B)  # 32 attention heads, max_position_embeddings 40960
H200 = GPU_PROFILES["h200"]


def check(params: dict[str, Any], **kw: Any) -> Violation | None:
    return refusal(SHAPE, H200, params, **kw)


def sched(params: dict[str, Any]) -> Violation | None:
    return scheduler_refusal(SHAPE, resolve_params(SHAPE, H200, params))


def test_defaults_pass() -> None:
    assert check({}) is None
    assert check({k: None for k in ("max_model_len", "max_num_seqs", "block_size")}) is None
    assert check({}, gpu_count=1, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "0"}) is None


# --- create_engine_config: the values as passed -----------------------------------------------


def test_partial_prefill() -> None:
    v = argument_refusal(SHAPE, {"max_num_partial_prefills": 2})
    assert v is not None and v.rule is Rule.PARTIAL_PREFILL
    assert v.exc_line == (
        "NotImplementedError: Concurrent Partial Prefill is not supported. We recommend to "
        "remove Concurrent Partial Prefill from your config."
    )
    assert v.reason is FailureReason.INVALID_CONFIG and v.stage == "api"
    assert argument_refusal(SHAPE, {"max_num_partial_prefills": 1}) is None


def test_max_model_len_above_derived() -> None:
    v = argument_refusal(SHAPE, {"max_model_len": 40961})
    assert v is not None and v.rule is Rule.MAX_MODEL_LEN and v.kind == "ValueError"
    assert v.message.startswith(
        "User-specified max_model_len (40961) is greater than the derived max_model_len "
        "(max_position_embeddings=40960 or model_max_length=None in model's config.json). To "
        "allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
    )
    for ok in (40960, -1, "auto", "-1", None):
        assert argument_refusal(SHAPE, {"max_model_len": ok}) is None, ok
    for flag in ("1", "true", "True"):
        env = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": flag}
        assert argument_refusal(SHAPE, {"max_model_len": 65536}, env=env) is None
    assert argument_refusal(SHAPE, {"max_model_len": 65536}, skip=[Rule.MAX_MODEL_LEN]) is None


@pytest.mark.parametrize(
    ("value", "words", "typ"),
    [
        (0.0, "greater than 0", "greater_than"),
        (-0.5, "greater than 0", "greater_than"),
        (1.5, "less than or equal to 1", "less_than_equal"),
    ],
)
def test_gpu_memory_utilization_range(value: float, words: str, typ: str) -> None:
    v = argument_refusal(SHAPE, {"gpu_memory_utilization": value})
    assert v is not None and v.rule is Rule.GPU_MEMORY_UTILIZATION
    assert v.field == "CacheConfig.gpu_memory_utilization"
    assert v.exc_line == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig\n"
        "gpu_memory_utilization\n"
        f"  Input should be {words} [type={typ}, input_value={value!r}, input_type=float]\n"
        f"    For further information visit https://errors.pydantic.dev/2.12/v/{typ}"
    )


def test_gpu_memory_utilization_bounds_pass() -> None:
    for ok in (1.0, 0.01, 0.92):
        assert argument_refusal(SHAPE, {"gpu_memory_utilization": ok}) is None


def test_block_size_range() -> None:
    v = argument_refusal(SHAPE, {"block_size": 0})
    assert v is not None and v.rule is Rule.BLOCK_SIZE_RANGE
    assert v.field == "CacheConfig.block_size"
    assert "Input should be greater than 0 [type=greater_than, input_value=0," in v.message
    assert argument_refusal(SHAPE, {"block_size": 1}) is None  # the backend check refuses it


def test_tensor_parallel_range_and_world_size() -> None:
    v = argument_refusal(SHAPE, {"tensor_parallel_size": 0})
    assert v is not None and v.rule is Rule.TENSOR_PARALLEL_RANGE
    assert v.field == "ParallelConfig.tensor_parallel_size"
    assert "Input should be greater than or equal to 1 [type=greater_than_equal" in v.message
    w = argument_refusal(SHAPE, {"tensor_parallel_size": 2}, gpu_count=1)
    assert w is not None and w.rule is Rule.WORLD_SIZE
    assert w.exc_line == (
        "ValueError: World size (2) is larger than the number of available GPUs (1) in this "
        "node. If this is intentional and you are using:\n"
        "- ray, set '--distributed-executor-backend ray'.\n"
        "- multiprocessing, set '--nnodes' appropriately."
    )
    assert argument_refusal(SHAPE, {"tensor_parallel_size": 2}, gpu_count=2) is None
    assert argument_refusal(SHAPE, {"tensor_parallel_size": 2}) is None  # count not known


@pytest.mark.parametrize("field", ["max_num_seqs", "max_num_batched_tokens", "stream_interval"])
def test_scheduler_ranges(field: str) -> None:
    v = argument_refusal(SHAPE, {field: 0})
    assert v is not None and v.rule is Rule.SCHEDULER_RANGES
    assert v.field == f"SchedulerConfig.{field}"
    assert v.message.startswith(f"1 validation error for SchedulerConfig\n{field}\n")
    assert argument_refusal(SHAPE, {field: 1}) is None


# --- after vLLM's defaults --------------------------------------------------------------------


def test_chunked_prefill_budget() -> None:
    v = sched({"enable_chunked_prefill": False, "max_num_batched_tokens": 2048})
    assert v is not None and v.rule is Rule.CHUNKED_PREFILL_BUDGET
    assert v.exc_line == (
        "ValueError: max_num_batched_tokens (2048) is smaller than max_model_len (40960). This "
        "effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM "
        "reject longer sequences. Please increase max_num_batched_tokens or decrease "
        "max_model_len."
    )
    # vLLM's default budget with chunked prefill off is max(max_model_len, 8192): accepted
    assert sched({"enable_chunked_prefill": False}) is None
    assert sched({"enable_chunked_prefill": False, "max_model_len": 4096}) is None
    assert sched({"enable_chunked_prefill": False, "max_num_batched_tokens": 40960}) is None
    edge = sched({"enable_chunked_prefill": False, "max_num_batched_tokens": 40959})
    assert edge is not None and edge.rule is Rule.CHUNKED_PREFILL_BUDGET
    assert sched({"max_num_batched_tokens": 2048}) is None  # chunked prefill on by default


def test_budget_below_max_num_seqs() -> None:
    v = sched({"max_num_seqs": 256, "max_num_batched_tokens": 128})
    assert v is not None and v.rule is Rule.BUDGET_BELOW_MAX_NUM_SEQS
    assert v.exc_line == (
        "ValueError: max_num_batched_tokens (128) must be greater than or equal to max_num_seqs "
        "(256)."
    )
    # an unset max_num_seqs is clamped to the budget; an unset budget (8192) covers 4096 seqs
    assert sched({"max_num_batched_tokens": 128}) is None
    assert sched({"max_num_seqs": 4096}) is None
    assert sched({"max_num_seqs": 256, "max_num_batched_tokens": 256}) is None
    edge = sched({"max_num_seqs": 256, "max_num_batched_tokens": 255})
    assert edge is not None and edge.rule is Rule.BUDGET_BELOW_MAX_NUM_SEQS
    v = sched({"max_num_seqs": 16384})  # the default budget 8192 is below it
    assert v is not None and v.rule is Rule.BUDGET_BELOW_MAX_NUM_SEQS


def test_attention_heads() -> None:
    v = sched({"tensor_parallel_size": 3})
    assert v is not None and v.rule is Rule.ATTENTION_HEADS
    assert v.exc_line == (
        "ValueError: Total number of attention heads (32) must be divisible by tensor parallel "
        "size (3)."
    )
    for tp in (1, 2, 4, 8):
        assert sched({"tensor_parallel_size": tp}) is None


# --- EngineCore: the attention backend --------------------------------------------------------


def test_block_size_supported() -> None:
    assert [b for b in range(1, 129) if block_size_supported(b)] == [
        16,
        32,
        48,
        64,
        80,
        96,
        112,
        128,
    ]


@pytest.mark.parametrize(
    ("params", "reasons"),
    [
        ({"block_size": 24}, (BLOCK_SIZE_NOT_SUPPORTED,)),
        ({"kv_cache_dtype": "nvfp4"}, (KV_CACHE_DTYPE_NOT_SUPPORTED,)),
        (
            {"block_size": 8, "kv_cache_dtype": "int8_per_token_head"},
            (BLOCK_SIZE_NOT_SUPPORTED, KV_CACHE_DTYPE_NOT_SUPPORTED),
        ),
    ],
)
def test_attention_backend(params: dict[str, Any], reasons: tuple[str, ...]) -> None:
    r = resolve_params(SHAPE, H200, params)
    v = backend_refusal(SHAPE, r)
    assert v is not None and v.rule is Rule.ATTENTION_BACKEND
    assert v.stage == "engine" and v.reasons == reasons
    why = "[" + ", ".join(reasons) + "]"
    assert v.exc_line == (
        "ValueError: No valid attention backend found for cuda with AttentionSelectorConfig("
        f"head_size=128, dtype=torch.bfloat16, kv_cache_dtype={r.kv_cache_dtype}, "
        f"block_size={r.block_size}, use_mla=False, has_sink=False, use_sparse=False, "
        "use_mm_prefix=False, attn_type=AttentionType.DECODER). Reasons: "
        f"{{FLASH_ATTN: {why}, FLASHINFER: {why}, TRITON_ATTN: {why}, FLEX_ATTENTION: {why}}}."
    )
    assert check(params) == v
    assert check(params, skip=[Rule.ATTENTION_BACKEND]) is None


@pytest.mark.parametrize(
    "params", [{"block_size": 32}, {"block_size": 64, "kv_cache_dtype": "fp8"}]
)
def test_attention_backend_accepts(params: dict[str, Any]) -> None:
    assert backend_refusal(SHAPE, resolve_params(SHAPE, H200, params)) is None


# --- vLLM's order -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "gpu_count", "first"),
    [
        ({"max_num_partial_prefills": 2, "max_model_len": 50000}, None, Rule.PARTIAL_PREFILL),
        ({"max_model_len": 50000, "gpu_memory_utilization": 1.5}, None, Rule.MAX_MODEL_LEN),
        ({"gpu_memory_utilization": 1.5, "block_size": 0}, None, Rule.GPU_MEMORY_UTILIZATION),
        ({"block_size": 0, "tensor_parallel_size": 0}, None, Rule.BLOCK_SIZE_RANGE),
        ({"tensor_parallel_size": 0, "max_num_seqs": 0}, None, Rule.TENSOR_PARALLEL_RANGE),
        ({"tensor_parallel_size": 3, "max_num_seqs": 0}, 2, Rule.WORLD_SIZE),
        (
            {"max_num_seqs": 0, "enable_chunked_prefill": False, "max_num_batched_tokens": 64},
            None,
            Rule.SCHEDULER_RANGES,
        ),
        (
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 512, "max_num_seqs": 1024},
            None,
            Rule.CHUNKED_PREFILL_BUDGET,
        ),
        (
            {"max_num_batched_tokens": 512, "max_num_seqs": 1024, "tensor_parallel_size": 3},
            None,
            Rule.BUDGET_BELOW_MAX_NUM_SEQS,
        ),
        ({"tensor_parallel_size": 3, "block_size": 24}, None, Rule.ATTENTION_HEADS),
    ],
)
def test_first_refusal_in_vllms_order(
    params: dict[str, Any], gpu_count: int | None, first: Rule
) -> None:
    v = check(params, gpu_count=gpu_count)
    assert v is not None and v.rule is first
    # skipping the first rule finds the next one
    nxt = check(params, gpu_count=gpu_count, skip=[first])
    assert nxt is not None and nxt.rule is not first


def test_scheduler_ranges_report_the_first_field() -> None:
    v = argument_refusal(SHAPE, {"max_num_batched_tokens": 0, "stream_interval": 0})
    assert v is not None and v.field == "SchedulerConfig.max_num_batched_tokens"


def test_api_refusal_is_arguments_then_scheduler() -> None:
    params = {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048}
    r = resolve_params(SHAPE, H200, params)
    v = api_refusal(SHAPE, params, r)
    assert v == scheduler_refusal(SHAPE, r)
    bad = {**params, "gpu_memory_utilization": 2.0}
    w = api_refusal(SHAPE, bad, resolve_params(SHAPE, H200, bad))
    assert w is not None and w.rule is Rule.GPU_MEMORY_UTILIZATION


# --- the simulated server raises exactly these ------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "env", "params", "gpu_count"),
    [
        (["--max-num-partial-prefills", "3"], {}, {"max_num_partial_prefills": 3}, 1),
        (["--max-model-len", "50000"], {}, {"max_model_len": 50000}, 1),
        (["--gpu-memory-utilization", "1.5"], {}, {"gpu_memory_utilization": 1.5}, 1),
        (["--block-size", "-16"], {}, {"block_size": -16}, 1),
        (["-tp", "2"], {"CUDA_VISIBLE_DEVICES": "0"}, {"tensor_parallel_size": 2}, 1),
        (["--stream-interval", "0"], {}, {"stream_interval": 0}, 1),
        (
            ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "4k"],
            {},
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 4000},
            1,
        ),
        (
            ["--max-num-seqs", "512", "--max-num-batched-tokens", "256"],
            {},
            {"max_num_seqs": 512, "max_num_batched_tokens": 256},
            1,
        ),
        (["-tp", "3"], {"CUDA_VISIBLE_DEVICES": "0,1,2"}, {"tensor_parallel_size": 3}, 3),
    ],
)
def test_simulated_server_raises_the_rule(
    flags: list[str], env: dict[str, str], params: dict[str, Any], gpu_count: int
) -> None:
    v = check(params, gpu_count=gpu_count)
    assert v is not None and v.stage == "api"
    with pytest.raises(Refusal) as e:
        resolve(parse_args(["serve", str(QWEN8B), *flags]), env)
    assert e.value.exc_line == v.exc_line
    assert e.value.stage == "api" and e.value.reason is v.reason


def test_simulated_server_allows_long_max_model_len_with_the_env_var() -> None:
    args = parse_args(["serve", str(QWEN8B), "--max-model-len", "50000"])
    s = resolve(args, {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert s.resolved.max_model_len == 50000


@pytest.mark.parametrize(
    "flags", [["--block-size", "24"], ["--kv-cache-dtype", "nvfp4"], ["--block-size", "8"]]
)
def test_simulated_engine_core_raises_the_backend_rule(flags: list[str]) -> None:
    s = resolve(parse_args(["serve", str(QWEN8B), *flags]), {})
    v = backend_refusal(SHAPE, s.resolved)
    assert v is not None
    with pytest.raises(Refusal) as e:
        engine_check(s, {}, "backend")
    assert e.value.exc_line == v.exc_line and e.value.stage == "engine"
    assert e.value.reason is FailureReason.INVALID_CONFIG


@pytest.mark.parametrize(
    ("name", "inside", "outside", "words"),
    [
        ("gpu_memory_utilization", 1.0, 0.0, "greater than 0"),
        ("gpu_memory_utilization", 0.01, 1.5, "less than or equal to 1"),
        ("block_size", 1, 0, "greater than 0"),
        ("tensor_parallel_size", 1, 0, "greater than or equal to 1"),
        ("max_num_seqs", 1, 0, "greater than or equal to 1"),
        ("max_num_batched_tokens", 1, 0, "greater than or equal to 1"),
        ("stream_interval", 1, 0, "greater than or equal to 1"),
    ],
)
def test_one_range_table_for_the_refusal_and_the_space(
    name: str, inside: float, outside: float, words: str
) -> None:
    """RANGES is what argument_refusal refuses with vLLM's text and what the space check allows."""
    from tuner.config import ModelConfig, ParamSpec, SpaceConfig
    from tuner.errors import ConfigError
    from tuner.space import validate_space
    from tuner.vllm_rules import RANGES

    assert argument_refusal(SHAPE, {name: inside}) is None
    v = argument_refusal(SHAPE, {name: outside})
    assert v is not None and v.field == f"{RANGES[name].config}.{name}"
    assert f"Input should be {words} " in v.message
    model = ModelConfig(path=str(QWEN8B), max_model_len=40960)

    def space(value: float) -> SpaceConfig:
        return SpaceConfig({name: ParamSpec(type="categorical", choices=[value], default=value)})

    validate_space(space(inside), model)
    with pytest.raises(ConfigError, match=re.escape(f"allowed: {RANGES[name].allowed}")):
        validate_space(space(outside), model)


def test_a_range_with_an_open_top() -> None:
    from tuner.vllm_rules import Range

    r = Range(0, True, 1, False, "0 <= x < 1")
    assert (r.broken(0), r.broken(0.99), r.broken(1), r.broken(-1)) == (
        None,
        None,
        ("lt", 1),
        ("ge", 0),
    )
