"""vLLM 0.24's config validation, written once: which parameters ``vllm serve`` refuses, and how.

Three users share these rules: the simulated server (:func:`tuner.sim.startup.resolve` and
:func:`tuner.sim.startup.engine_check`, which print the texts in a traceback and exit 1), the
simulator's in-process landscape (:func:`tuner.sim.landscape.config_refusal`) and the tuner's
precheck (:func:`tuner.precheck.precheck`, which vetoes a trial before launch). Each rule gives
vLLM's exception class and exact text (vLLM 0.24.0's source, mainly ``vllm/config/`` and
``vllm/engine/arg_utils.py``: https://github.com/vllm-project/vllm/tree/v0.24.0/vllm) as a
:class:`Violation`; every function returns the *first* one in vLLM's order, or ``None``.

vLLM's order, and which function checks what:

1. :func:`argument_refusal` — ``create_engine_config`` on the values as passed (``None`` or absent
   means "not passed"): ``max_num_partial_prefills`` ≠ 1, a user ``max_model_len`` above the
   derived one (unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``), the pydantic ranges of CacheConfig and
   ParallelConfig (``tensor_parallel_size``, ``data_parallel_size``), the world size (TP) against
   the visible GPUs, the pydantic ranges of SchedulerConfig.
2. (the compilation config: the ``cudagraph_mode`` name and the capture sizes; these need the
   command line itself, so :mod:`tuner.sim.startup` checks them here.)
3. :func:`scheduler_refusal` — after vLLM's defaults (:func:`tuner.memory.resolve_params`): chunked
   prefill off with ``max_num_batched_tokens < max_model_len``, ``max_num_batched_tokens <
   max_num_seqs``, TP not dividing the attention heads.

:func:`api_refusal` is 1 then 3. All of these happen in the API server before any engine process
starts (``stage="api"``). Later, in the EngineCore (``stage="engine"``), after the free-memory check
at init (which depends on the machine, not the config), :func:`backend_refusal` finds that no
Hopper attention backend takes the block size or the KV-cache dtype (§1.4). :func:`refusal` is
:func:`api_refusal` then :func:`backend_refusal`. The KV-cache memory checks are
:func:`tuner.memory.estimate`'s.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Mapping
from typing import Any

from tuner.errors import FailureReason
from tuner.memory import GpuProfile, ModelShape, ResolvedParams, resolve_params

__all__ = [
    "BLOCK_SIZE_NOT_SUPPORTED",
    "KV_CACHE_DTYPE_NOT_SUPPORTED",
    "NUMERICS",
    "PYDANTIC_URL",
    "RANGES",
    "SUPPORTED_KV_CACHE_DTYPES",
    "Range",
    "Rule",
    "Violation",
    "api_refusal",
    "argument_refusal",
    "backend_refusal",
    "block_size_supported",
    "numerics_changes",
    "refusal",
    "scheduler_refusal",
]

PYDANTIC_URL = "https://errors.pydantic.dev/2.12/v"
PYDANTIC_ERROR = "pydantic_core._pydantic_core.ValidationError"
SUPPORTED_KV_CACHE_DTYPES = frozenset(
    {"auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"}
)
"""KV-cache dtypes the simulated Hopper backends take. Narrower than real vLLM (FlashInfer also
lists ``nvfp4``, and there are TurboQuant backends): the precheck does not veto on this."""
BLOCK_SIZE_NOT_SUPPORTED = "block_size not supported"
KV_CACHE_DTYPE_NOT_SUPPORTED = "kv_cache_dtype not supported"
HOPPER_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
"""Non-MLA backends in vLLM's selection order on SM90 (``platforms/cuda.py:152-159``)."""
LONG_MAX_MODEL_LEN_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


@dataclasses.dataclass(frozen=True)
class Range:
    """The values vLLM allows for a numeric parameter: pydantic's ``gt``/``ge`` (``low``) and
    ``le``/``lt`` (``high``) on its config field."""

    low: float
    low_inclusive: bool
    high: float | None
    high_inclusive: bool
    allowed: str
    """The allowed values in words, for the tuner's messages (:mod:`tuner.space`'s check)."""
    config: str | None = None
    """The pydantic config class of the field, where :func:`argument_refusal` gives vLLM's error
    for it; None: a range only the space check applies."""

    def broken(self, value: float) -> tuple[str, float] | None:
        """The pydantic constraint ``value`` breaks (``("gt", 0)``), or None inside the range."""
        if value < self.low or (value == self.low and not self.low_inclusive):
            return ("ge" if self.low_inclusive else "gt", self.low)
        high = self.high
        if high is not None and (value > high or (value == high and not self.high_inclusive)):
            return ("le" if self.high_inclusive else "lt", high)
        return None


RANGES: dict[str, Range] = {
    "gpu_memory_utilization": Range(0, False, 1, True, "0 < x <= 1", "CacheConfig"),
    "block_size": Range(
        0, False, None, True, "an integer >= 1 (multiples of 16 on Hopper)", "CacheConfig"
    ),
    "tensor_parallel_size": Range(1, True, None, True, "an integer >= 1", "ParallelConfig"),
    "data_parallel_size": Range(1, True, None, True, "an integer >= 1", "ParallelConfig"),
    "max_num_seqs": Range(1, True, None, True, "an integer >= 1", "SchedulerConfig"),
    "max_num_batched_tokens": Range(1, True, None, True, "an integer >= 1", "SchedulerConfig"),
    "stream_interval": Range(1, True, None, True, "an integer >= 1", "SchedulerConfig"),
    "max_model_len": Range(
        1, True, None, True, "an integer >= 1, at most the model's max_model_len"
    ),
    "max_cudagraph_capture_size": Range(0, True, None, True, "an integer >= 0"),
    "cpu_offload_gb": Range(0, True, None, True, "a number >= 0"),
    "watermark": Range(0, True, 1, False, "0 <= x < 1"),
}
"""vLLM 0.24's ranges of the common numeric parameters (its pydantic config fields,
``vllm/config/*.py``), written once: :func:`argument_refusal` refuses with vLLM's error those
with a ``config`` (in vLLM's order), and :func:`tuner.space.validate_space` checks every searched
bound against them."""


class Rule(enum.StrEnum):
    """One validation rule of vLLM (the name of a check; pass some to ``skip``)."""

    PARTIAL_PREFILL = "partial_prefill"
    MAX_MODEL_LEN = "max_model_len"
    GPU_MEMORY_UTILIZATION = "gpu_memory_utilization"
    BLOCK_SIZE_RANGE = "block_size_range"
    TENSOR_PARALLEL_RANGE = "tensor_parallel_range"
    DATA_PARALLEL_RANGE = "data_parallel_range"
    WORLD_SIZE = "world_size"
    SCHEDULER_RANGES = "scheduler_ranges"
    CHUNKED_PREFILL_BUDGET = "chunked_prefill_budget"
    BUDGET_BELOW_MAX_NUM_SEQS = "budget_below_max_num_seqs"
    ATTENTION_HEADS = "attention_heads"
    ATTENTION_BACKEND = "attention_backend"


@dataclasses.dataclass(frozen=True)
class Violation:
    """One refusal: the exception vLLM raises, as its traceback's last line shows it."""

    rule: Rule
    kind: str
    """The exception class as the traceback names it: ``ValueError``, ``NotImplementedError``,
    ``pydantic_core._pydantic_core.ValidationError``."""
    message: str
    """``str(exception)``: vLLM's exact text (for pydantic, its multi-line error report)."""
    stage: str = "api"
    """``api``: ``create_engine_config`` in the API server; ``engine``: EngineCore start-up."""
    reason: FailureReason = FailureReason.INVALID_CONFIG
    field: str | None = None
    """For a pydantic error, ``Config.field`` (e.g. ``CacheConfig.block_size``)."""
    reasons: tuple[str, ...] = ()
    """For :attr:`Rule.ATTENTION_BACKEND`, why the backends refused (``block_size not supported``,
    ``kv_cache_dtype not supported``)."""

    @property
    def exc_line(self) -> str:
        """The traceback's last line(s): ``ValueError: ...``."""
        return f"{self.kind}: {self.message}"


_PYDANTIC_OPS = {
    "gt": ("greater than", "greater_than"),
    "ge": ("greater than or equal to", "greater_than_equal"),
    "le": ("less than or equal to", "less_than_equal"),
    "lt": ("less than", "less_than"),
}


def _pydantic(rule: Rule, model: str, field: str, op: str, bound: Any, value: Any) -> Violation:
    words, typ = _PYDANTIC_OPS[op]
    text = (
        f"1 validation error for {model}\n"
        f"{field}\n"
        f"  Input should be {words} {bound} [type={typ}, input_value={value!r}, "
        f"input_type={type(value).__name__}]\n"
        f"    For further information visit {PYDANTIC_URL}/{typ}"
    )
    return Violation(rule, PYDANTIC_ERROR, text, field=f"{model}.{field}")


def _out_of_range(rule: Rule, name: str, value: Any) -> Violation | None:
    """vLLM's pydantic error for ``value`` outside ``RANGES[name]`` (None: not passed, or in it)."""
    rng = RANGES[name]
    broken = None if value is None else rng.broken(value)
    if broken is None:
        return None
    assert rng.config is not None, name
    op, bound = broken
    return _pydantic(rule, rng.config, name, op, bound, value)


_SCHEDULER_FIELDS = tuple(n for n, r in RANGES.items() if r.config == "SchedulerConfig")
"""SchedulerConfig's fields in the order vLLM validates them (``max_num_seqs`` first)."""


def _user_max_model_len(value: Any) -> int | None:
    """A user-specified ``max_model_len``; ``None`` when not passed or ``-1``/``auto``."""
    if value is None or value in ("auto", "-1"):
        return None
    mml = int(value)
    return None if mml == -1 else mml


def _long_max_model_len_allowed(env: Mapping[str, str]) -> bool:
    return env.get(LONG_MAX_MODEL_LEN_ENV, "0") in ("1", "true", "True")


def argument_refusal(
    shape: ModelShape,
    params: Mapping[str, Any],
    *,
    gpu_count: int | None = None,
    env: Mapping[str, str] | None = None,
    skip: Collection[Rule] = (),
) -> Violation | None:
    """The checks of ``create_engine_config`` on the values as passed, in vLLM's order.

    ``params`` uses vLLM's parameter names; absent or ``None`` means "not passed" (vLLM's default,
    which always passes these checks). ``gpu_count``: the GPUs visible to the server (``None``:
    not checked). ``env``: the server's environment (``VLLM_ALLOW_LONG_MAX_MODEL_LEN``).
    """
    env = env or {}
    partial = params.get("max_num_partial_prefills")
    if Rule.PARTIAL_PREFILL not in skip and partial is not None and partial != 1:
        return Violation(
            Rule.PARTIAL_PREFILL,
            "NotImplementedError",
            "Concurrent Partial Prefill is not supported. We recommend to remove Concurrent "
            "Partial Prefill from your config.",
        )
    mml = _user_max_model_len(params.get("max_model_len"))
    derived = shape.max_position_embeddings
    if (
        Rule.MAX_MODEL_LEN not in skip
        and mml is not None
        and mml > derived
        and not _long_max_model_len_allowed(env)
    ):
        return Violation(
            Rule.MAX_MODEL_LEN,
            "ValueError",
            f"User-specified max_model_len ({mml}) is greater than the derived max_model_len "
            f"(max_position_embeddings={derived} or model_max_length={shape.model_max_length} "
            "in model's config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with "
            "extreme caution. If the model uses relative position encoding (RoPE), positions "
            "exceeding derived_max_model_len lead to nan. If the model uses absolute position "
            "encoding, positions exceeding derived_max_model_len will cause a CUDA array "
            "out-of-bounds error.",
        )
    for rule, name in (
        (Rule.GPU_MEMORY_UTILIZATION, "gpu_memory_utilization"),
        (Rule.BLOCK_SIZE_RANGE, "block_size"),
    ):
        found = None if rule in skip else _out_of_range(rule, name, params.get(name))
        if found is not None:
            return found
    tp = params.get("tensor_parallel_size")
    tp = 1 if tp is None else tp
    if Rule.TENSOR_PARALLEL_RANGE not in skip:
        found = _out_of_range(Rule.TENSOR_PARALLEL_RANGE, "tensor_parallel_size", tp)
        if found is not None:
            return found
    if Rule.DATA_PARALLEL_RANGE not in skip:  # ParallelConfig's next field (``ge=1``)
        dp = params.get("data_parallel_size")
        found = _out_of_range(Rule.DATA_PARALLEL_RANGE, "data_parallel_size", dp)
        if found is not None:
            return found
    if Rule.WORLD_SIZE not in skip and gpu_count is not None and tp > gpu_count:
        return Violation(
            Rule.WORLD_SIZE,
            "ValueError",
            f"World size ({tp}) is larger than the number of available GPUs ({gpu_count}) in "
            "this node. If this is intentional and you are using:\n"
            "- ray, set '--distributed-executor-backend ray'.\n"
            "- multiprocessing, set '--nnodes' appropriately.",
        )
    if Rule.SCHEDULER_RANGES not in skip:
        for name in _SCHEDULER_FIELDS:
            found = _out_of_range(Rule.SCHEDULER_RANGES, name, params.get(name))
            if found is not None:
                return found
    return None


def scheduler_refusal(
    shape: ModelShape, r: ResolvedParams, *, skip: Collection[Rule] = ()
) -> Violation | None:
    """The checks on the values after vLLM's defaults (SchedulerConfig, ModelConfig), in order."""
    mnbt, mml, seqs = r.max_num_batched_tokens, r.max_model_len, r.max_num_seqs
    if Rule.CHUNKED_PREFILL_BUDGET not in skip and not r.enable_chunked_prefill and mnbt < mml:
        return Violation(
            Rule.CHUNKED_PREFILL_BUDGET,
            "ValueError",
            f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({mml}). This "
            "effectively limits the maximum sequence length to max_num_batched_tokens and makes "
            "vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease "
            "max_model_len.",
        )
    if Rule.BUDGET_BELOW_MAX_NUM_SEQS not in skip and mnbt < seqs:
        return Violation(
            Rule.BUDGET_BELOW_MAX_NUM_SEQS,
            "ValueError",
            f"max_num_batched_tokens ({mnbt}) must be greater than or equal to max_num_seqs "
            f"({seqs}).",
        )
    tp = r.tensor_parallel_size
    if Rule.ATTENTION_HEADS not in skip and shape.num_attention_heads % tp:
        return Violation(
            Rule.ATTENTION_HEADS,
            "ValueError",
            f"Total number of attention heads ({shape.num_attention_heads}) must be divisible "
            f"by tensor parallel size ({tp}).",
        )
    return None


def api_refusal(
    shape: ModelShape,
    params: Mapping[str, Any],
    r: ResolvedParams,
    *,
    gpu_count: int | None = None,
    env: Mapping[str, str] | None = None,
    skip: Collection[Rule] = (),
) -> Violation | None:
    """:func:`argument_refusal` on ``params`` (as passed), then :func:`scheduler_refusal` on ``r``
    (``resolve_params`` of the same ``params``): everything the API server refuses."""
    return argument_refusal(
        shape, params, gpu_count=gpu_count, env=env, skip=skip
    ) or scheduler_refusal(shape, r, skip=skip)


def block_size_supported(block_size: int) -> bool:
    """Every non-MLA Hopper backend needs a multiple of 16 (FA3, Triton, Flex:
    ``MultipleOf(16)``; FlashInfer: 16/32/64 and their multiples; vLLM 0.24.0's attention
    backends, https://github.com/vllm-project/vllm/tree/v0.24.0/vllm/v1/attention/backends)."""
    return block_size % 16 == 0


def backend_refusal(shape: ModelShape, r: ResolvedParams) -> Violation | None:
    """No attention backend takes the block size or the KV-cache dtype (EngineCore, model init:
    ``ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(...)``)."""
    reasons = []
    if not block_size_supported(r.block_size):
        reasons.append(BLOCK_SIZE_NOT_SUPPORTED)
    if r.kv_cache_dtype not in SUPPORTED_KV_CACHE_DTYPES:
        reasons.append(KV_CACHE_DTYPE_NOT_SUPPORTED)
    if not reasons:
        return None
    why = "[" + ", ".join(reasons) + "]"
    dtype = "torch.float32" if shape.dtype_bytes == 4 else "torch.bfloat16"
    per_backend = ", ".join(f"{b}: {why}" for b in HOPPER_BACKENDS)
    return Violation(
        Rule.ATTENTION_BACKEND,
        "ValueError",
        "No valid attention backend found for cuda with "
        f"AttentionSelectorConfig(head_size={shape.head_dim}, dtype={dtype}, "
        f"kv_cache_dtype={r.kv_cache_dtype}, block_size={r.block_size}, use_mla=False, "
        "has_sink=False, use_sparse=False, use_mm_prefix=False, "
        f"attn_type=AttentionType.DECODER). Reasons: {{{per_backend}}}.",
        stage="engine",
        reasons=tuple(reasons),
    )


def refusal(
    shape: ModelShape,
    gpu: GpuProfile,
    params: Mapping[str, Any],
    *,
    resolved: ResolvedParams | None = None,
    gpu_count: int | None = None,
    env: Mapping[str, str] | None = None,
    skip: Collection[Rule] = (),
) -> Violation | None:
    """The first refusal of ``vllm serve`` for ``params`` (as passed) on ``gpu``, memory aside:
    :func:`api_refusal`, then :func:`backend_refusal` (unless :attr:`Rule.ATTENTION_BACKEND` is
    skipped). ``resolved``: ``resolve_params(shape, gpu, params)`` if already computed."""
    r = resolved if resolved is not None else resolve_params(shape, gpu, params)
    found = api_refusal(shape, params, r, gpu_count=gpu_count, env=env, skip=skip)
    if found is None and Rule.ATTENTION_BACKEND not in skip:
        found = backend_refusal(shape, r)
    return found


NUMERICS: Mapping[str, tuple[Any, ...]] = {
    "kv_cache_dtype": ("auto",),
    "quantization": (None,),
    "dtype": ("auto",),
    "speculative_config": (None,),
}
"""The ``vllm serve`` options (by their argparse ``dest``) that can change the numbers the model
computes, each with the values that leave them as vLLM's default does: the KV cache's dtype
(``CacheConfig.cache_dtype``), weight quantization and the model's dtype (``ModelConfig``), and
speculative decoding (``SpeculativeConfig``; lossless in exact arithmetic, but the verification
runs batched kernels). The confirm stage's quality guard checks a pick that sets one of these
(:mod:`tuner.quality_guard`); the simulated server changes its greedy outputs on them."""


def numerics_changes(args: Mapping[str, Any]) -> dict[str, Any]:
    """Of ``args`` (``dest`` → value, or flag → value: dashes and leading ``--`` are
    normalised), those of :data:`NUMERICS` set to a value other than vLLM's default behaviour."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        dest = key.lstrip("-").replace("-", "_")
        neutral = NUMERICS.get(dest)
        if neutral is not None and value not in neutral and not _empty(value):
            out[dest] = value
    return out


def _empty(value: Any) -> bool:
    """Not passed (None: the flag is left out, as the lever screen's defaults arm) or empty."""
    return value is None or (isinstance(value, str | Mapping) and not value)
