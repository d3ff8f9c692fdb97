"""Config resolution and the start-up refusals of ``vllm serve`` 0.24, with vLLM's exact texts.

Two stages, as in vLLM: :func:`resolve` runs the API-server-side checks of
``create_engine_config`` (pydantic ranges, max_model_len, scheduler limits, TP, world size) and
raises :class:`Refusal` with ``stage="api"``; :func:`engine_check` runs what the EngineCore finds
(free memory at init, attention backend, the KV-cache memory checks from :mod:`tuner.memory`) and
raises with ``stage="engine"``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.errors import FailureReason
from tuner.memory import (
    GPU_PROFILES,
    GpuProfile,
    MemoryEstimate,
    ModelShape,
    ResolvedParams,
    estimate,
    format_gib,
    resolve_params,
)
from tuner.sim.cli import CUDAGRAPH_MODES, SimArgs

__all__ = ["Refusal", "Settings", "engine_check", "env_float", "gpu_from_env", "resolve"]

PYDANTIC_URL = "https://errors.pydantic.dev/2.12/v"
SUPPORTED_KV_DTYPES = {"auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"}


class Refusal(Exception):
    """A start-up failure: ``exc_line`` is the last traceback line (``ValueError: ...``)."""

    def __init__(
        self,
        exc_line: str,
        frames: list[str],
        stage: str = "api",
        reason: FailureReason = FailureReason.INVALID_CONFIG,
    ) -> None:
        super().__init__(exc_line)
        self.exc_line = exc_line
        self.frames = frames
        self.stage = stage
        self.reason = reason


API_FRAMES = [
    '  File "/usr/local/bin/vllm", line 10, in <module>',
    "    sys.exit(main())",
    '  File "/usr/local/lib/python3.12/site-packages/vllm/entrypoints/cli/main.py", line 75, '
    "in main",
    "    args.dispatch_function(args)",
    '  File "/usr/local/lib/python3.12/site-packages/vllm/engine/arg_utils.py", line 1771, '
    "in create_engine_config",
]
ENGINE_FRAMES = [
    '  File "/usr/local/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 1220, '
    "in run_engine_core",
    "    engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
    '  File "/usr/local/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 145, '
    "in __init__",
]


def _pydantic(model: str, field: str, op: str, bound: Any, value: Any) -> Refusal:
    kinds = {
        "gt": ("greater than", "greater_than"),
        "ge": ("greater than or equal to", "greater_than_equal"),
        "le": ("less than or equal to", "less_than_equal"),
    }
    words, typ = kinds[op]
    text = (
        f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {model}\n"
        f"{field}\n"
        f"  Input should be {words} {bound} [type={typ}, input_value={value!r}, "
        f"input_type={type(value).__name__}]\n"
        f"    For further information visit {PYDANTIC_URL}/{typ}"
    )
    return Refusal(text, API_FRAMES)


def _value_error(msg: str, kind: str = "ValueError") -> Refusal:
    return Refusal(f"{kind}: {msg}", API_FRAMES)


def gpu_from_env(env: Mapping[str, str]) -> tuple[GpuProfile, int]:
    """The GPU profile (``TUNER_SIM_GPU[_MEMORY_GIB]``) and count (``CUDA_VISIBLE_DEVICES``)."""
    name = env.get("TUNER_SIM_GPU", "h200").lower()
    gpu = GPU_PROFILES.get(name, GPU_PROFILES["h200"])
    if env.get("TUNER_SIM_GPU_MEMORY_GIB"):
        gpu = GpuProfile(gpu.name, float(env["TUNER_SIM_GPU_MEMORY_GIB"]))
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    count = len([d for d in cvd.split(",") if d.strip()]) if cvd is not None else 1
    return gpu, count


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the simulated server needs after the config checks passed."""

    model_dir: Path
    shape: ModelShape
    gpu: GpuProfile
    gpu_count: int
    params: dict[str, Any]
    resolved: ResolvedParams
    memory: MemoryEstimate
    served_names: tuple[str, ...]
    max_model_len: int
    image_limit: int


def _cudagraph_settings(args: SimArgs) -> tuple[str | None, int | None, list[int] | None]:
    cc = args.compilation_config
    mode = cc.get("cudagraph_mode")
    if mode is not None:
        name = str(mode).upper()
        if name not in CUDAGRAPH_MODES:
            raise Refusal(f"KeyError: '{name}'", API_FRAMES)
        mode = name
    elif args.optimization_level == 0:
        mode = "NONE"
    elif args.optimization_level == 1:
        mode = "PIECEWISE"
    comp_mode = cc.get("mode")
    if comp_mode in (0, "NONE") and mode in (None, "PIECEWISE", "FULL_AND_PIECEWISE"):
        mode = "NONE"
    if args.ns.cudagraph_capture_sizes is not None and "cudagraph_capture_sizes" in cc:
        raise _value_error(
            "cudagraph_capture_sizes and compilation_config.cudagraph_capture_sizes are "
            "mutually exclusive"
        )
    if args.ns.max_cudagraph_capture_size is not None and "max_cudagraph_capture_size" in cc:
        raise _value_error(
            "max_cudagraph_capture_size and compilation_config.max_cudagraph_capture_size are "
            "mutually exclusive"
        )
    sizes = args.ns.cudagraph_capture_sizes or cc.get("cudagraph_capture_sizes")
    max_size = args.ns.max_cudagraph_capture_size
    if max_size is None:
        max_size = cc.get("max_cudagraph_capture_size")
    if sizes and max_size is not None and int(max_size) != max(sizes):
        raise _value_error(
            f"customized max_cudagraph_capture_size(={max_size}) should be consistent with the "
            f"max value of cudagraph_capture_sizes(={max(sizes)})"
        )
    return mode, (int(max_size) if max_size is not None else None), sizes


def resolve(args: SimArgs, env: Mapping[str, str]) -> Settings:
    """Apply vLLM's defaults and the API-server-side checks; raise :class:`Refusal`."""
    model_dir = Path(args.model_tag)
    if not (model_dir / "config.json").is_file():
        raise Refusal(
            f"ValueError: Invalid repository ID or local directory specified: '{args.model_tag}'.",
            API_FRAMES,
        )
    shape = ModelShape.from_dir(model_dir)
    gpu, gpu_count = gpu_from_env(env)
    if args.max_num_partial_prefills != 1:
        raise _value_error(
            "Concurrent Partial Prefill is not supported. We recommend to remove Concurrent "
            "Partial Prefill from your config.",
            "NotImplementedError",
        )
    derived = shape.max_position_embeddings
    mml = args.max_model_len
    if (
        mml is not None
        and mml > derived
        and env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0") not in ("1", "true", "True")
    ):
        raise _value_error(
            f"User-specified max_model_len ({mml}) is greater than the derived max_model_len "
            f"(max_position_embeddings={derived} or model_max_length={shape.model_max_length} "
            "in model's config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with "
            "extreme caution. If the model uses relative position encoding (RoPE), positions "
            "exceeding derived_max_model_len lead to nan. If the model uses absolute position "
            "encoding, positions exceeding derived_max_model_len will cause a CUDA array "
            "out-of-bounds error."
        )
    gmu = args.gpu_memory_utilization
    if gmu <= 0:
        raise _pydantic("CacheConfig", "gpu_memory_utilization", "gt", 0, gmu)
    if gmu > 1:
        raise _pydantic("CacheConfig", "gpu_memory_utilization", "le", 1, gmu)
    if args.block_size is not None and args.block_size <= 0:
        raise _pydantic("CacheConfig", "block_size", "gt", 0, args.block_size)
    tp = args.tensor_parallel_size
    if tp < 1:
        raise _pydantic("ParallelConfig", "tensor_parallel_size", "ge", 1, tp)
    if tp > gpu_count:
        raise _value_error(
            f"World size ({tp}) is larger than the number of available GPUs ({gpu_count}) in "
            "this node. If this is intentional and you are using:\n"
            "- ray, set '--distributed-executor-backend ray'.\n"
            "- multiprocessing, set '--nnodes' appropriately."
        )
    for field in ("max_num_seqs", "max_num_batched_tokens", "stream_interval"):
        value = getattr(args, field)
        if value is not None and value < 1:
            raise _pydantic("SchedulerConfig", field, "ge", 1, value)
    mode, max_size, sizes = _cudagraph_settings(args)
    params: dict[str, Any] = {
        "gpu_memory_utilization": gmu,
        "tensor_parallel_size": tp,
        "block_size": args.block_size,
        "max_model_len": mml,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "kv_cache_dtype": args.kv_cache_dtype,
        "enforce_eager": args.enforce_eager,
        "cudagraph_mode": mode,
        "enable_chunked_prefill": args.enable_chunked_prefill,
        "enable_prefix_caching": args.enable_prefix_caching,
        "performance_mode": args.performance_mode,
        "max_cudagraph_capture_size": max_size,
        "cudagraph_capture_sizes": sizes,
        "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
        "num_gpu_blocks_override": args.num_gpu_blocks_override,
    }
    r = resolve_params(shape, gpu, params)
    if not r.enable_chunked_prefill and r.max_num_batched_tokens < r.max_model_len:
        raise _value_error(
            f"max_num_batched_tokens ({r.max_num_batched_tokens}) is smaller than max_model_len "
            f"({r.max_model_len}). This effectively limits the maximum sequence length to "
            "max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
            "max_num_batched_tokens or decrease max_model_len."
        )
    if r.max_num_batched_tokens < r.max_num_seqs:
        raise _value_error(
            f"max_num_batched_tokens ({r.max_num_batched_tokens}) must be greater than or equal "
            f"to max_num_seqs ({r.max_num_seqs})."
        )
    if shape.num_attention_heads % tp:
        raise _value_error(
            f"Total number of attention heads ({shape.num_attention_heads}) must be divisible "
            f"by tensor parallel size ({tp})."
        )
    mem = estimate(shape, gpu, params)
    names = tuple(args.served_model_name or [args.model_tag])
    image = args.limit_mm_per_prompt.get("image", 999)
    if isinstance(image, dict):
        image = image.get("count", 999)
    return Settings(
        model_dir=model_dir,
        shape=shape,
        gpu=gpu,
        gpu_count=gpu_count,
        params=params,
        resolved=r,
        memory=mem,
        served_names=names,
        max_model_len=mem.max_model_len,
        image_limit=int(image),
    )


def engine_check(s: Settings, env: Mapping[str, str], stage: str) -> None:
    """EngineCore-side start-up failures. ``stage``: ``init``, ``backend`` or ``kv``."""
    r = s.resolved
    if stage == "init":
        total = s.gpu.total_bytes
        used = float(env.get("TUNER_SIM_USED_GIB", "0") or 0) * (1 << 30)
        free = total - used
        requested = math.ceil(total * r.gpu_memory_utilization)
        if free < requested:
            raise Refusal(
                f"ValueError: Free memory on device cuda:0 ({format_gib(free)}/"
                f"{format_gib(total)} GiB) on startup is less than desired GPU memory "
                f"utilization ({r.gpu_memory_utilization}, {format_gib(requested)} GiB). Decrease "
                "GPU memory utilization or reduce GPU memory used by other processes.",
                ENGINE_FRAMES,
                "engine",
                FailureReason.GPU_BUSY,
            )
    elif stage == "backend":
        reasons = []
        if r.block_size % 16:
            reasons.append("block_size not supported")
        if r.kv_cache_dtype not in SUPPORTED_KV_DTYPES:
            reasons.append("kv_cache_dtype not supported")
        if reasons:
            why = "[" + ", ".join(reasons) + "]"
            dtype = "torch.float32" if s.shape.dtype_bytes == 4 else "torch.bfloat16"
            raise Refusal(
                "ValueError: No valid attention backend found for cuda with "
                f"AttentionSelectorConfig(head_size={s.shape.head_dim}, dtype={dtype}, "
                f"kv_cache_dtype={r.kv_cache_dtype}, block_size={r.block_size}, use_mla=False, "
                "has_sink=False, use_sparse=False, use_mm_prefix=False, "
                "attn_type=AttentionType.DECODER). Reasons: "
                f"{{FLASH_ATTN: {why}, FLASHINFER: {why}, TRITON_ATTN: {why}, "
                f"FLEX_ATTENTION: {why}}}.",
                ENGINE_FRAMES,
                "engine",
            )
    elif stage == "kv" and s.memory.failure is not None:
        raise Refusal(f"ValueError: {s.memory.message}", ENGINE_FRAMES, "engine", s.memory.failure)


def env_float(env: Mapping[str, str], key: str, default: float) -> float:
    try:
        return float(env.get(key, "") or default)
    except ValueError:
        return default
