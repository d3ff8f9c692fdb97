"""Per-GPU memory model of vLLM 0.24: the KV-cache tokens a configuration gets, or why it fails.

Shared by the simulated engine (:mod:`tuner.sim`) and the tuner, which uses it to predict the KV
cache before a launch. vLLM's own computation (``gpu_worker.determine_available_memory``)::

    budget    = gpu_memory_utilization x total                  (per GPU)
    kv_bytes  = budget - weights - activation_peak - cudagraph_estimate
    kv_tokens = floor(kv_bytes / (block_size x bytes_per_token)) x block_size

Here ``weights`` is the parameter bytes computed from ``config.json`` (:mod:`tuner.model_shape`)
divided by TP; ``activation_peak`` and ``cudagraph_estimate`` come from the fitted model below.

**Data parallelism** (``data_parallel_size``, DP) does not change a GPU's figures: each of the DP
engine replicas holds the full weights on its own TP GPUs (TP splits them, DP copies them), sizes
its own KV cache the same way, and serves its own requests. So :func:`estimate` is per GPU and its
``kv_tokens`` are one replica's; a server has DP times as many, on TP x DP GPUs.

**Fit** (calibrated on real vLLM 0.24 on an H200, 140.4 GiB visible, Qwen3-8B bf16, weights
15.26 GiB computed vs "Model loading took 15.27 GiB" logged)::

    activation = ACT_BASE_GIB (0.10)
               + max_num_batched_tokens x dtype x (2 x intermediate/TP + 4 x hidden + qkv/TP)
               + max_num_seqs x vocab x 4 B (fp32 logits) x LOGITS_COPIES (1.0)
    cudagraph  = mode_factor x (GRAPH_PER_SIZE_MIB (3 MiB) x n_capture_sizes
                 + max_capture_size x hidden x dtype x layers x GRAPH_TOKEN_FACTOR (1.0))
                 mode_factor: FULL_AND_PIECEWISE 1.0, PIECEWISE 0.6, FULL/FULL_DECODE_ONLY 0.5

For Qwen3-8B defaults that is 1.40 GiB of activations + 0.29 GiB of graphs. Against the real runs:

=====================  =========  ==========  ========
config                 real       model       error
=====================  =========  ==========  ========
defaults (gmu 0.92)    814,368    817,184     +0.35 %
--enforce-eager        816,640    819,296     +0.33 %
gmu 0.30               185,488    183,312     -1.17 %
TP=2 (gmu 0.92)        1,739,792  1,748,864   +0.52 %
gmu 0.12               fails      fails       (KV -0.10 GiB: NO_KV_MEMORY)
=====================  =========  ==========  ========

Qwen2.5-0.5B shape (Qwen2ForCausalLM), with ``ARCH_OVERHEAD_GIB`` (below):

=================================  ==========  ==========  ========
config                             real        model       error
=================================  ==========  ==========  ========
defaults (gmu 0.92)                10,918,288  10,926,816  +0.08 %
--enforce-eager                    10,949,872  10,941,664  -0.07 %
gmu 0.5, max_num_batched_tokens    5,788,496   5,788,576   +0.00 %
2048
=================================  ==========  ==========  ========

(``tests/unit/test_memory.py`` checks these points.) The real overhead is not constant in gmu
(2.06 GiB at 0.92, 1.38 GiB at 0.30); a constant overhead is the simplest model inside ±2 %.

Vision-language models (Qwen3-VL, ``models/qwen3-vl-8b-dummy``): the KV cache, activations and
graphs come from the decoder (``text_config``); ``weights`` adds the vision tower
(:func:`tuner.model_shape.vision_param_count`: 0.58e9 parameters, 1.07 GiB in bf16 for
Qwen3-VL-8B, so 16.33 GiB in all). One H200 point (vLLM's defaults, max_model_len 262,144):
787,488 tokens logged; the model without an overhead said 809,360 (+2.8 %); with
``ARCH_OVERHEAD_GIB`` (fitted on that point) 787,520.

Not modelled: pre-snapshot usage (CUDA context, NCCL buffers) which does not count against the
budget, the multimodal encoder profile (vLLM runs the vision tower on its largest input before
sizing the KV cache: one 16,384-token image for Qwen3-VL-8B) and the encoder cache,
MLA/hybrid/sliding-window models, quantized checkpoints and CPU offload.

**Online fp8 weights** (``--quantization fp8`` on a bf16 checkpoint, :func:`weight_bytes`): the
decoder's linear layers hold 1 byte per weight; the embeddings, the LM head, the norms and a
vision tower keep the checkpoint's dtype. One H200 point (Qwen3-8B, vLLM's defaults otherwise):
861,024 tokens logged, 864,288 modelled (+0.38 %); the same model in bf16 predicts 817,184
(docs/gpu-runs/2026-12-02-screen-fp8.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.errors import FailureReason
from tuner.model_shape import DTYPE_BYTES, ModelShape

__all__ = [
    "GPU_PROFILES",
    "NVML_WORDS",
    "GiB",
    "GpuProfile",
    "MemoryEstimate",
    "ModelShape",  # tuner.model_shape's, the argument of everything here
    "ResolvedParams",
    "capture_sizes",
    "estimate",
    "format_gib",
    "kv_bytes_per_token",
    "kv_too_small_message",
    "profile_of",
    "VLLM_DEFAULTS",
    "resolve_params",
]

GiB = 1 << 30

VLLM_DEFAULTS: dict[str, Any] = {
    "gpu_memory_utilization": 0.92,
    "tensor_parallel_size": 1,
    "data_parallel_size": 1,
    "block_size": 16,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "enforce_eager": False,
    "kv_cache_dtype": "auto",
    "performance_mode": "balanced",
    "async_scheduling": True,
}
"""``vllm serve`` 0.24's defaults that depend on nothing else (an unset flag means this value);
the derived ones (``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``, the CUDA-graph
mode and capture sizes) are :func:`resolve_params`'s. ``conf/space/default.yaml`` states the same
values as its ``default``s (``tests/unit/test_memory.py`` holds them equal)."""

ACT_BASE_GIB = 0.10
ARCH_OVERHEAD_GIB: dict[str, float] = {
    "Qwen2ForCausalLM": 2.13,
    "Qwen3VLForConditionalGeneration": 3.0,
}
"""Measured extra non-KV memory per architecture (GiB per GPU). vLLM 0.24 served the Qwen2.5-0.5B
shape with its older model runner (``gpu_model_runner.py``, where Qwen3 used ``model_runner.py``)
and held 2.04-2.23 GiB more than the fit above in all three H200 runs of 2026-11-30
(docs/gpu-runs/2026-11-30-h200.md): defaults, ``--enforce-eager``, gmu 0.5 with mnbt 2048.
The Qwen3-VL-8B shape (also ``gpu_model_runner.py``), defaults, one H200 run of 2026-11-30
(docs/gpu-runs/2026-11-30-h200x2-studies.md): 3.0 GiB more — weights 16.79 GiB logged against
16.33 counted, graphs 0.54 against 0.29, and 2.3 GiB more for the profiling run, which includes
the vision encoder on its largest input (16,384 tokens); fitted on that one point."""
LOGITS_COPIES = 1.0
GRAPH_PER_SIZE_MIB = 3.0
GRAPH_TOKEN_FACTOR = 1.0
GRAPH_MODE_FACTOR = {
    "NONE": 0.0,
    "PIECEWISE": 0.6,
    "FULL": 0.5,
    "FULL_DECODE_ONLY": 0.5,
    "FULL_AND_PIECEWISE": 1.0,
}
DOCS_URL = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"

NO_KV_MEMORY_MESSAGE = (
    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
    "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, "
    f"despite its name). See {DOCS_URL} for more details."
)


def format_gib(num_bytes: float) -> str:
    """vLLM's ``format_gib``: GiB rounded to 2 decimals, printed as Python prints the float."""
    return str(round(num_bytes / GiB, 2))


@dataclasses.dataclass(frozen=True)
class GpuProfile:
    name: str
    total_gib: float

    @property
    def total_bytes(self) -> int:
        return int(self.total_gib * GiB)


GPU_PROFILES: dict[str, GpuProfile] = {
    "h200": GpuProfile("h200", 140.4),
    "h100": GpuProfile("h100", 79.65),
}
"""The GPUs the memory and speed models were measured on (:func:`profile_of` finds a leased
one's), with the memory NVML reports. The speed model (:class:`tuner.sim.engine.SpeedModel`) is
the H200's on both: on 86 H100 servers (2026-12-05 ... 12-07) it read output tok/s within 5.3 %
and TPOT p50 within 4.7 % (medians), and the memory model their KV tokens within -0.7 ... +1.6 %;
scaling its weight and KV reads by the H100's lower memory bandwidth read chat's tok/s 11-16 %
low and TPOT p50 19-24 % high instead (docs/sim-calibration.md, "The H100")."""
NVML_WORDS: dict[str, tuple[str, ...]] = {"h200": ("h200",), "h100": ("h100", "hbm3")}
"""The words a GPU's NVML name holds for :data:`GPU_PROFILES`' entry: the measured H100 reads
"NVIDIA H100 80GB HBM3" (the SXM module); the H100 PCIe and H100 NVL are other GPUs, with less
memory bandwidth (NVIDIA's datasheet, https://www.nvidia.com/en-us/data-center/h100/)."""


def profile_of(nvml_name: str) -> GpuProfile | None:
    """The :data:`GPU_PROFILES` entry whose :data:`NVML_WORDS` the NVML name holds, else None."""
    words = set(nvml_name.lower().replace("-", " ").split())
    return next((GPU_PROFILES[k] for k, need in NVML_WORDS.items() if set(need) <= words), None)


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """What one configuration gets per GPU. ``kv_tokens`` is 0 when ``failure`` is set."""

    budget_gib: float
    weights_gib: float
    activation_gib: float
    cudagraph_gib: float
    kv_gib: float
    bytes_per_token: int
    """KV bytes per token on one GPU (after TP sharding of the KV heads)."""
    kv_tokens: int
    max_concurrency: float
    max_model_len: int
    failure: FailureReason | None = None
    message: str | None = None
    """The exact vLLM error text this configuration is predicted to fail with."""

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def num_blocks(self) -> int:
        return self.kv_tokens


@dataclasses.dataclass(frozen=True)
class ResolvedParams:
    """Engine parameters after vLLM's defaulting rules (see :func:`resolve_params`)."""

    gpu_memory_utilization: float
    tensor_parallel_size: int
    block_size: int
    max_model_len: int
    auto_max_model_len: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    kv_dtype_bytes: int
    enforce_eager: bool
    cudagraph_mode: str
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    capture_sizes: tuple[int, ...]
    kv_cache_memory_bytes: int | None
    num_gpu_blocks_override: int | None
    data_parallel_size: int = 1
    """Engine replicas, each on its own ``tensor_parallel_size`` GPUs with the full weights
    (module docstring): every per-GPU figure above is one replica's."""
    quantization: str | None = None
    """``--quantization`` (None: the checkpoint's own weights): :func:`weight_bytes`, and the
    simulator's step time (:class:`tuner.sim.engine.SpeedModel`)."""
    async_scheduling: bool = True
    """``--async-scheduling`` (vLLM 0.24's default on): the simulator's host time between steps
    when off (:meth:`tuner.sim.engine.SpeedModel.host_time`)."""
    stream_interval: int = 1
    """``--stream-interval`` (vLLM 0.24's default 1): the API server sends one output per this
    many tokens, so the simulator's admission delay per running request is this much shorter
    (:meth:`tuner.sim.engine.Scheduler.add`)."""


def _get(params: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``params[key]`` unless absent or None; else ``default``, else :data:`VLLM_DEFAULTS`'."""
    value = params.get(key)
    if value is not None:
        return value
    return VLLM_DEFAULTS[key] if default is None else default


def weight_bytes(shape: ModelShape, quantization: str | None = None) -> int:
    """The weights vLLM loads (:attr:`ModelShape.weight_bytes`); with ``quantization`` ``fp8``
    (online, from a 16-bit checkpoint) the decoder's linear layers at 1 byte a weight: all its
    parameters but the embeddings (and an untied LM head) and the norms (module docstring)."""
    if quantization != "fp8" or shape.dtype_bytes <= 1:
        return shape.weight_bytes
    embed = shape.vocab_size * shape.hidden_size * (1 if shape.tie_word_embeddings else 2)
    norms = (2 * shape.num_layers + 1) * shape.hidden_size
    linear = max(0, shape.param_count - embed - norms)
    return shape.weight_bytes - linear * (shape.dtype_bytes - 1)


def kv_dtype_bytes(shape: ModelShape, kv_cache_dtype: str | None) -> int:
    dtype = (kv_cache_dtype or "auto").lower()
    if dtype == "auto":
        return shape.dtype_bytes
    if dtype.startswith("fp8") or dtype.startswith("int8") or dtype.startswith("turboquant"):
        return 1
    if dtype == "nvfp4":
        return 1
    return DTYPE_BYTES.get(dtype, shape.dtype_bytes)


def kv_bytes_per_token(shape: ModelShape, kv_cache_dtype: str | None, tp: int) -> int:
    """KV bytes per token on one GPU: 2 x layers x kv_heads/TP x head_dim x dtype bytes."""
    heads = max(1, shape.num_kv_heads // max(1, tp))
    return 2 * shape.num_layers * heads * shape.head_dim * kv_dtype_bytes(shape, kv_cache_dtype)


def capture_sizes(
    max_num_seqs: int,
    max_num_batched_tokens: int,
    *,
    max_capture_size: int | None = None,
    sizes: Sequence[int] | None = None,
    performance_mode: str = "balanced",
) -> tuple[int, ...]:
    """vLLM's CUDA-graph capture sizes (``config/vllm.py``), without speculative decoding."""
    if sizes:
        return tuple(sorted({int(s) for s in sizes if int(s) <= max_num_batched_tokens}))
    cap = max_capture_size if max_capture_size is not None else min(max_num_seqs * 2, 512)
    cap = min(cap, max_num_batched_tokens)
    if cap <= 0:
        return ()
    if performance_mode == "interactivity":
        base = list(range(1, min(cap, 32) + 1))
        base += [s for s in range(40, 256, 8)] + list(range(256, cap + 1, 16))
    else:
        base = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, cap + 1, 16))
    out = {s for s in base if s <= cap}
    out.add(cap)
    return tuple(sorted(out))


def resolve_params(shape: ModelShape, gpu: GpuProfile, params: Mapping[str, Any]) -> ResolvedParams:
    """Apply vLLM 0.24's defaults for ``vllm serve`` (big-GPU usage context) to ``params``."""
    big = gpu.total_gib >= 70
    chunked = bool(_get(params, "enable_chunked_prefill"))
    mml_raw = params.get("max_model_len")
    auto_mml = mml_raw in (-1, "-1", "auto")
    mml = shape.max_position_embeddings if mml_raw is None or auto_mml else int(mml_raw)
    perf = str(_get(params, "performance_mode"))
    mult = 2 if perf == "throughput" else 1
    mns_user = params.get("max_num_seqs")
    mnbt_user = params.get("max_num_batched_tokens")
    if mnbt_user is not None:
        mnbt = int(mnbt_user)
    else:
        mnbt = (8192 if big else 2048) * mult
        if not chunked:
            mnbt = max(mml, mnbt)
    default_mns = min((1024 if big else 256) * mult, mnbt)
    mns = int(mns_user) if mns_user is not None else default_mns
    if mnbt_user is None:
        mnbt = min(mnbt, mns * mml)
    eager = bool(_get(params, "enforce_eager"))
    default_mode = "NONE" if eager else "FULL_AND_PIECEWISE"
    mode = str(_get(params, "cudagraph_mode", default_mode)).upper()
    if eager:
        mode = "NONE"
    sizes: tuple[int, ...] = ()
    if mode != "NONE":
        sizes = capture_sizes(
            mns,
            mnbt,
            max_capture_size=params.get("max_cudagraph_capture_size"),
            sizes=params.get("cudagraph_capture_sizes"),
            performance_mode=perf,
        )
    kvd = str(_get(params, "kv_cache_dtype"))
    kvmb = params.get("kv_cache_memory_bytes")
    ngbo = params.get("num_gpu_blocks_override")
    return ResolvedParams(
        gpu_memory_utilization=float(_get(params, "gpu_memory_utilization")),
        tensor_parallel_size=int(_get(params, "tensor_parallel_size")),
        block_size=int(_get(params, "block_size")),
        max_model_len=mml,
        auto_max_model_len=auto_mml,
        max_num_seqs=mns,
        max_num_batched_tokens=mnbt,
        kv_cache_dtype=kvd,
        kv_dtype_bytes=kv_dtype_bytes(shape, kvd),
        enforce_eager=eager,
        cudagraph_mode=mode,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=bool(_get(params, "enable_prefix_caching")),
        capture_sizes=sizes,
        kv_cache_memory_bytes=int(kvmb) if kvmb is not None else None,
        num_gpu_blocks_override=int(ngbo) if ngbo is not None else None,
        data_parallel_size=int(_get(params, "data_parallel_size")),
        quantization=params.get("quantization"),
        async_scheduling=bool(_get(params, "async_scheduling")),
        stream_interval=max(1, int(_get(params, "stream_interval", 1))),
    )


def activation_bytes(shape: ModelShape, r: ResolvedParams) -> float:
    """Peak of the profiling forward pass (``max_num_batched_tokens`` tokens) + sampler run."""
    tp = r.tensor_parallel_size
    qkv = (shape.num_attention_heads + 2 * shape.num_kv_heads) * shape.head_dim
    per_token = shape.dtype_bytes * (
        2 * shape.intermediate_size / tp + 4 * shape.hidden_size + qkv / tp
    )
    logits = r.max_num_seqs * shape.vocab_size * 4 * LOGITS_COPIES
    extra = ARCH_OVERHEAD_GIB.get(shape.architecture, 0.0) * GiB
    return ACT_BASE_GIB * GiB + r.max_num_batched_tokens * per_token + logits + extra


def cudagraph_bytes(shape: ModelShape, r: ResolvedParams) -> float:
    """vLLM's ``Estimated CUDA graph memory``: 0 with graphs off."""
    factor = GRAPH_MODE_FACTOR.get(r.cudagraph_mode, 1.0)
    if factor == 0 or not r.capture_sizes:
        return 0.0
    per_size = GRAPH_PER_SIZE_MIB * (1 << 20) * len(r.capture_sizes)
    per_token = shape.hidden_size * shape.dtype_bytes * shape.num_layers * GRAPH_TOKEN_FACTOR
    return factor * (per_size + max(r.capture_sizes) * per_token)


def kv_too_small_message(
    max_model_len: int, needed_bytes: float, available_bytes: float, estimated_max_len: int
) -> str:
    """vLLM's text (``kv_cache_utils._check_enough_kv_cache_memory``), unbalanced '(' included."""
    estimated = (
        f"Based on the available memory, the estimated maximum model length is "
        f"{estimated_max_len}. "
        if estimated_max_len > 0
        else ""
    )
    return (
        f"To serve at least one request with the model's max seq len ({max_model_len}), "
        f"({format_gib(needed_bytes)} GiB KV cache is needed, which is larger than the available "
        f"KV cache memory ({format_gib(available_bytes)} GiB). {estimated}"
        "Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU "
        "backend) or decreasing `max_model_len` when initializing the engine. "
        f"See {DOCS_URL} for more details."
    )


def estimate(shape: ModelShape, gpu: GpuProfile, params: Mapping[str, Any]) -> MemoryEstimate:
    """Predict vLLM's KV cache (per GPU; tokens for the whole TP group, one DP replica's) for
    ``params``; ``data_parallel_size`` changes no figure (the module docstring).

    ``params`` uses the tuner's names (``gpu_memory_utilization``, ``tensor_parallel_size``,
    ``block_size``, ``max_model_len``, ``max_num_seqs``, ``max_num_batched_tokens``,
    ``kv_cache_dtype``, ``enforce_eager``, ``cudagraph_mode``, ``enable_chunked_prefill``, and
    optionally ``performance_mode``, ``max_cudagraph_capture_size``, ``cudagraph_capture_sizes``,
    ``kv_cache_memory_bytes``, ``num_gpu_blocks_override``, ``quantization``); absent or
    ``None`` means vLLM's default.
    """
    r = resolve_params(shape, gpu, params)
    tp = r.tensor_parallel_size
    budget = r.gpu_memory_utilization * gpu.total_bytes
    weights = weight_bytes(shape, params.get("quantization")) / tp
    act = activation_bytes(shape, r)
    graphs = cudagraph_bytes(shape, r)
    if r.kv_cache_memory_bytes is not None:
        kv = float(r.kv_cache_memory_bytes)
    else:
        kv = budget - weights - act - graphs
    bpt = kv_bytes_per_token(shape, r.kv_cache_dtype, tp)
    page = bpt * r.block_size
    mml = r.max_model_len

    def result(
        tokens: int, failure: FailureReason | None = None, message: str | None = None
    ) -> MemoryEstimate:
        return MemoryEstimate(
            budget_gib=budget / GiB,
            weights_gib=weights / GiB,
            activation_gib=act / GiB,
            cudagraph_gib=graphs / GiB,
            kv_gib=kv / GiB,
            bytes_per_token=bpt,
            kv_tokens=tokens,
            max_concurrency=tokens / mml if mml > 0 else 0.0,
            max_model_len=mml,
            failure=failure,
            message=message,
        )

    if kv <= 0:
        return result(0, FailureReason.NO_KV_MEMORY, NO_KV_MEMORY_MESSAGE)
    blocks = int(kv // page)
    if r.num_gpu_blocks_override is not None:
        blocks = r.num_gpu_blocks_override
    tokens = blocks * r.block_size
    estimated_max = (int(kv) // page) * r.block_size
    if r.auto_max_model_len:
        if estimated_max <= 0:
            msg = (
                "Cannot auto-fit max_model_len: not enough GPU memory available to serve even a "
                "single token. Try increasing `gpu_memory_utilization`."
            )
            return result(0, FailureReason.KV_TOO_SMALL, msg)
        mml = min(mml, estimated_max)
    needed = math.ceil(mml / r.block_size) * page
    if needed > kv:
        msg = kv_too_small_message(mml, needed, kv, min(estimated_max, mml))
        return result(0, FailureReason.KV_TOO_SMALL, msg)
    return result(tokens)
