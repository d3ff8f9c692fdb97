"""Config resolution and the start-up refusals of ``vllm serve`` 0.24, with vLLM's exact texts.

Two stages, as in vLLM: :func:`resolve` runs the API-server-side checks of
``create_engine_config`` (pydantic ranges, max_model_len, scheduler limits, TP, world size) and
raises :class:`Refusal` with ``stage="api"``; :func:`engine_check` runs what the EngineCore finds
(free memory at init, attention backend, the KV-cache memory checks from :mod:`tuner.memory`) and
raises with ``stage="engine"``. The config rules themselves (texts included) live in
:mod:`tuner.vllm_rules`, shared with the landscape and the precheck; this module adds what needs
the command line or the machine (model directory, compilation config, free memory).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner import vllm_rules
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

__all__ = [
    "Refusal",
    "Settings",
    "compile_hashes",
    "compiles",
    "engine_check",
    "env_float",
    "gpu_from_env",
    "resolve",
]


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


def _value_error(msg: str) -> Refusal:
    return Refusal(f"ValueError: {msg}", API_FRAMES)


def _raise(found: vllm_rules.Violation | None) -> None:
    """Raise ``found`` (a rule of :mod:`tuner.vllm_rules`) as the server's traceback."""
    if found is not None:
        frames = API_FRAMES if found.stage == "api" else ENGINE_FRAMES
        raise Refusal(found.exc_line, frames, found.stage, found.reason)


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
    if not model_dir.is_dir():  # a Hugging Face repo id, as vLLM takes one: from the HF cache
        from tuner.errors import ConfigError
        from tuner.model_source import local_files

        try:
            model_dir = local_files(args.model_tag)
        except ConfigError:
            pass
    if not (model_dir / "config.json").is_file():
        raise Refusal(
            f"ValueError: Invalid repository ID or local directory specified: '{args.model_tag}'.",
            API_FRAMES,
        )
    shape = ModelShape.from_dir(model_dir)
    gpu, gpu_count = gpu_from_env(env)
    params: dict[str, Any] = {
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "tensor_parallel_size": args.tensor_parallel_size,
        "data_parallel_size": args.data_parallel_size,
        "block_size": args.block_size,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "kv_cache_dtype": args.kv_cache_dtype,
        "quantization": args.quantization,
        "enforce_eager": args.enforce_eager,
        "enable_chunked_prefill": args.enable_chunked_prefill,
        "enable_prefix_caching": args.enable_prefix_caching,
        "performance_mode": args.performance_mode,
        "async_scheduling": args.async_scheduling,
        "stream_interval": args.stream_interval,
        "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
        "num_gpu_blocks_override": args.num_gpu_blocks_override,
    }
    given = {
        **params,
        "max_num_partial_prefills": args.max_num_partial_prefills,
    }
    # vLLM's order: the argument checks, the compilation config, then the scheduler checks
    _raise(vllm_rules.argument_refusal(shape, given, gpu_count=gpu_count, env=env))
    mode, max_size, sizes = _cudagraph_settings(args)
    params["cudagraph_mode"] = mode
    params["max_cudagraph_capture_size"] = max_size
    params["cudagraph_capture_sizes"] = sizes
    r = resolve_params(shape, gpu, params)
    _raise(vllm_rules.scheduler_refusal(shape, r))
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
        _raise(vllm_rules.backend_refusal(s.shape, r))
    elif stage == "kv" and s.memory.failure is not None:
        raise Refusal(f"ValueError: {s.memory.message}", ENGINE_FRAMES, "engine", s.memory.failure)


def env_float(env: Mapping[str, str], key: str, default: float) -> float:
    try:
        return float(env.get(key, "") or default)
    except ValueError:
        return default


def compiles(s: Settings, args: SimArgs) -> bool:
    """Whether vLLM would torch.compile: not with ``--enforce-eager`` or ``-cc.mode=0``."""
    mode = str(args.compilation_config.get("mode", "")).upper()
    return not s.resolved.enforce_eager and mode not in ("0", "NONE")


def compile_hashes(s: Settings, version: str) -> tuple[str, str]:
    """The simulated server's compile cache keys ``(config hash, AOT hash)``, from its own
    resolved settings and the factors vLLM 0.24 hashes (``VllmConfig.compute_hash``): the
    version, the model, max_model_len, the dtype, block_size, the KV cache dtype,
    max_num_batched_tokens, TP, the CUDA-graph mode and capture sizes (where max_num_seqs
    enters); not gpu_memory_utilization, prefix caching or chunked prefill."""
    r = s.resolved
    factors = [
        version,
        str(s.model_dir),
        s.max_model_len,
        s.shape.dtype_bytes,
        r.block_size,
        r.kv_cache_dtype,
        r.max_num_batched_tokens,
        r.tensor_parallel_size,
        r.cudagraph_mode,
        list(r.capture_sizes),
    ]
    digest = hashlib.sha256(str(factors).encode()).hexdigest()
    return digest[:10], hashlib.sha256(f"aot {factors}".encode()).hexdigest()
