"""Stage 2 — precheck: failures that are certain before launch, told to Optuna without a server.

Three kinds, each with the reason vLLM itself would give:

* the tuner's own limits — TP × DP (the server's GPUs: each of the DP replicas on its own TP
  GPUs) larger than the GPU lease, TP not dividing the attention heads, a
  ``max_model_len`` shorter than more than the error budget of the workload's requests
  (``precheck``);
* vLLM 0.24's config validation (:mod:`tuner.vllm_rules`, the rules the
  simulated server refuses with) on the flags the trial passes, after vLLM's defaults — e.g.
  chunked prefill off with ``max_num_batched_tokens < max_model_len``; ``max_num_batched_tokens <
  max_num_seqs``; a block size that is not a multiple of 16 (no Hopper attention backend takes it,
  §1.4) (``invalid_config``, vLLM's text after ``predicted before launch: ``);
* memory (``tuner.memory``, the simulator's model) — no KV memory at all, or less than one
  ``max_model_len`` request needs (``no_kv_memory`` / ``kv_too_small``) — but only when the
  predicted deficit exceeds the model's error margin, so borderline configs still launch. Per
  GPU: TP splits the weights over its GPUs; DP does not change a GPU's figures (each replica
  holds the full weights on its own TP GPUs), so a DP layout fits where its TP alone fits.

The margin: ``0.5 GiB + 2 %`` of the gmu budget. On the H200 the model was within 1.4 % of vLLM's
logged KV tokens for Qwen3-8B (docs/gpu-runs/2026-11-30-h200.md); at gmu 0.92 2 % is 2.6 GiB.

The GPU (:func:`leased_gpu`): with ``engine.kind=vllm`` and NVML, the leased GPUs' own memory
(the smallest of ``engine.gpus``); a GPU the model was not measured on (its NVML name names no
profile of ``tuner.memory.GPU_PROFILES``) gets a wider margin, ``1 GiB + 5 %``, and a note.
Without NVML, and for the simulator (which models ``engine.gpu``), the ``engine.gpu`` profile.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.config import SpaceConfig, TunerConfig
from tuner.engine.argv import fixed_params, passed
from tuner.engine.pool import gpus_per_server
from tuner.errors import EngineError, FailureReason, TrialFailed
from tuner.memory import (
    GPU_PROFILES,
    GiB,
    GpuProfile,
    MemoryEstimate,
    ModelShape,
    estimate,
    profile_of,
    resolve_params,
)
from tuner.records import RequestSpec
from tuner.space import resolved
from tuner.telemetry.gpu import gpu_memory, nvml_available
from tuner.vllm_rules import (
    BLOCK_SIZE_NOT_SUPPORTED,
    Rule,
    Violation,
    api_refusal,
    backend_refusal,
)

__all__ = [
    "MARGIN_FRACTION",
    "MARGIN_GIB",
    "UNMEASURED_MARGIN_FRACTION",
    "UNMEASURED_MARGIN_GIB",
    "LeasedGpu",
    "Verdict",
    "gpu_of",
    "leased_gpu",
    "passed_params",
    "precheck",
    "refusal",
    "with_fixed",
]

log = logging.getLogger(__name__)

MARGIN_GIB = 0.5
MARGIN_FRACTION = 0.02
UNMEASURED_MARGIN_GIB = 1.0
UNMEASURED_MARGIN_FRACTION = 0.05
"""The margin on a GPU the memory model was not measured on."""


@dataclass(frozen=True)
class LeasedGpu:
    """The GPU the memory model predicts for (:func:`leased_gpu`)."""

    profile: GpuProfile | None
    """None: no profile and no NVML; the memory is not predicted."""
    measured: bool
    """The memory model was measured on this GPU (the normal margin); else the wider one."""
    source: str
    """Where the figures come from, for the dry run."""
    note: str | None = None
    """Said once when the margin is widened or the memory cannot be predicted."""

    @property
    def margin(self) -> tuple[float, float]:
        """(GiB, fraction of the gmu budget) a predicted deficit must exceed to be certain."""
        if self.measured:
            return MARGIN_GIB, MARGIN_FRACTION
        return UNMEASURED_MARGIN_GIB, UNMEASURED_MARGIN_FRACTION


@functools.lru_cache(maxsize=16)
def leased_gpu(kind: str, name: str, gpus: tuple[int, ...]) -> LeasedGpu:
    """The GPU of ``engine.kind`` / ``engine.gpu`` / ``engine.gpus``: with ``vllm`` and NVML, the
    smallest leased GPU's total memory (vLLM's ``gpu_memory_utilization`` is a share of it), its
    profile's name where its NVML name names one; else the ``engine.gpu`` profile (the simulator
    models that one). Cached per process: the dry run and every trial ask again."""
    profile = GPU_PROFILES.get(name)
    mem = []
    if kind == "vllm" and nvml_available():
        try:
            mem = gpu_memory(gpus)
        except EngineError as exc:
            log.warning("NVML could not read GPUs %s (%s); memory model on engine.gpu", gpus, exc)
    if mem:
        small = min(mem, key=lambda m: m.total_gib)
        known = profile_of(small.name)
        total = round(small.total_gib, 2)
        source = f"GPU {small.index}: {small.name or '?'}, {small.total_gib:.1f} GiB (NVML)"
        if known is not None:
            return LeasedGpu(dataclasses.replace(known, total_gib=total), True, source)
        found = GpuProfile(small.name, total)
        gib, frac = UNMEASURED_MARGIN_GIB, UNMEASURED_MARGIN_FRACTION
        note = (
            f"the memory model was measured on {', '.join(GPU_PROFILES)}, not on "
            f"{small.name or 'this GPU'}: the precheck refuses a config only when its predicted "
            f"KV memory is short by more than {gib:g} GiB + {frac:.0%} of its budget"
        )
        log.warning(note)
        return LeasedGpu(found, False, source, note)
    if profile is not None:
        why = "the simulator's GPU" if kind == "sim" else "NVML cannot read the GPU here"
        return LeasedGpu(profile, True, f"engine.gpu={name}, {profile.total_gib:g} GiB ({why})")
    note = (
        f"engine.gpu {name!r} has no profile ({', '.join(GPU_PROFILES)}) and NVML cannot read "
        "the GPU here: the precheck does not predict memory"
    )
    return LeasedGpu(None, False, f"engine.gpu={name} (no profile)", note)


def gpu_of(cfg: TunerConfig) -> LeasedGpu:
    """:func:`leased_gpu` of ``cfg.engine``."""
    return leased_gpu(cfg.engine.kind, cfg.engine.gpu, tuple(cfg.engine.gpus))


@dataclass(frozen=True)
class Verdict:
    """What the precheck predicted for a config that may launch."""

    estimate: MemoryEstimate | None

    @property
    def kv_tokens(self) -> int | None:
        if self.estimate is None:
            return None
        return self.estimate.kv_tokens if self.estimate.failure is None else 0


def precheck(
    cfg: TunerConfig,
    shape: ModelShape,
    params: Mapping[str, Any],
    requests: Sequence[RequestSpec],
    *,
    baseline: bool = False,
    veto: bool = True,
) -> Verdict:
    """Raise :class:`TrialFailed` for a certain failure; else return the memory prediction.

    ``params`` are the resolved values (vLLM's defaults filled in); ``baseline`` means no searched
    flag is passed, so vLLM's rules for user-set values do not apply. ``veto=False`` only predicts
    (the tuner's own limits still apply).
    """
    params = with_fixed(cfg, params, baseline=baseline)
    _tuner_limits(cfg, shape, params, requests)
    if veto and not baseline:
        _vllm_validation(cfg, shape, params)
    gpu = gpu_of(cfg)
    if gpu.profile is None:
        return Verdict(None)
    try:
        est = estimate(shape, gpu.profile, params)
    except (ValueError, KeyError, TypeError, ZeroDivisionError):
        return Verdict(None)
    if veto and est.failure is not None and _certain(est, *gpu.margin):
        raise TrialFailed(est.failure, f"predicted before launch: {est.message}")
    return Verdict(est)


def with_fixed(
    cfg: TunerConfig, params: Mapping[str, Any], *, baseline: bool = False
) -> dict[str, Any]:
    """The values the server runs with: ``params`` (resolved), then ``model.fixed_args`` over
    vLLM's defaults (:func:`tuner.engine.argv.fixed_params`), then the searched flags the trial
    passes over those (they follow the fixed ones on the command line; vLLM takes the last). A
    baseline trial passes no searched flag: its fixed ones hold."""
    fixed = fixed_params(cfg.model)
    if not fixed:
        return dict(params)
    searched = {} if baseline else passed_params(cfg.space, params)
    return {**params, **fixed, **searched}


def refusal(
    cfg: TunerConfig,
    shape: ModelShape,
    params: Mapping[str, Any],
    requests: Sequence[RequestSpec],
) -> str | None:
    """The failure reason :func:`precheck` refuses ``params`` with before launch (the searched
    values; vLLM's defaults fill in the rest), or None if they would launch."""
    try:
        precheck(cfg, shape, resolved(cfg.space, params), requests)
    except TrialFailed as exc:
        return exc.reason.value
    return None


def _certain(
    est: MemoryEstimate, margin_gib: float = MARGIN_GIB, margin_fraction: float = MARGIN_FRACTION
) -> bool:
    """The predicted deficit is larger than the model's error margin."""
    need_gib = est.bytes_per_token * max(est.max_model_len, 1) / GiB
    if est.failure is FailureReason.NO_KV_MEMORY:
        deficit = max(-est.kv_gib, 0.0) + need_gib
    else:
        deficit = need_gib - est.kv_gib
    return deficit > margin_gib + margin_fraction * est.budget_gib


def _tuner_limits(
    cfg: TunerConfig, shape: ModelShape, params: Mapping[str, Any], requests: Sequence[RequestSpec]
) -> None:
    tp = int(params.get("tensor_parallel_size") or 1)
    dp = int(params.get("data_parallel_size") or 1)
    if gpus_per_server(params) > len(cfg.engine.gpus):
        layout = f"tensor_parallel_size {tp}"
        if dp > 1:
            layout += f" x data_parallel_size {dp} = {tp * dp} GPUs"
        raise TrialFailed(
            FailureReason.PRECHECK, f"{layout} exceeds the GPU lease {cfg.engine.gpus}"
        )
    if shape.num_attention_heads % tp:
        raise TrialFailed(
            FailureReason.PRECHECK,
            f"tensor_parallel_size {tp} does not divide the {shape.num_attention_heads} "
            "attention heads",
        )
    mml = params.get("max_model_len")
    if isinstance(mml, int) and requests:
        too_long = [r for r in requests if r.prompt_tokens + r.output_tokens > mml]
        if len(too_long) > cfg.objective.max_error_rate * len(requests):
            longest = max(r.prompt_tokens + r.output_tokens for r in requests)
            raise TrialFailed(
                FailureReason.PRECHECK,
                f"max_model_len {mml} is shorter than {len(too_long)} of {len(requests)} "
                f"requests (longest {longest:,} tokens); vLLM would reject them",
            )


def passed_params(space: SpaceConfig, params: Mapping[str, Any]) -> dict[str, Any]:
    """The flags a trial with these resolved ``params`` passes (:func:`tuner.engine.argv.passed`),
    once the defaults of the params the space does not search (disabled) are left out: no trial
    passes those. The rest stay at vLLM's default, and vLLM's defaulting (e.g. clamping an unset
    ``max_num_seqs`` to ``max_num_batched_tokens``) depends on what was passed."""
    searched = {
        name: value
        for name, value in params.items()
        if name not in space.params or space.params[name].enabled
    }
    return passed(space, searched)


def _vllm_validation(cfg: TunerConfig, shape: ModelShape, params: Mapping[str, Any]) -> None:
    """vLLM 0.24's config validation (:mod:`tuner.vllm_rules`) on the flags the trial passes.

    Not vetoed here: a ``max_model_len`` above ``max_position_embeddings`` (real vLLM derives a
    longer limit for RoPE-scaled models, and the space check already bounds it by
    ``model.max_model_len``); the world size (the lease has ``tensor_parallel_size`` GPUs); an
    unsupported KV-cache dtype (the simulator knows fewer backends than vLLM has). On a GPU without
    a profile, vLLM's defaults are unknown: a config is vetoed only if it fails with both the
    big-GPU and the small-GPU defaults.
    """
    passed = passed_params(cfg.space, params)
    gpu = gpu_of(cfg).profile
    profiles = [gpu] if gpu is not None else [GpuProfile("big", 80.0), GpuProfile("small", 40.0)]
    found: list[Violation] = []
    for profile in profiles:
        r = resolve_params(shape, profile, passed)
        v = api_refusal(shape, passed, r, skip=(Rule.MAX_MODEL_LEN,))
        if v is None:
            v = backend_refusal(shape, r)
            if v is not None and BLOCK_SIZE_NOT_SUPPORTED not in v.reasons:
                v = None
        if v is None:
            return
        found.append(v)
    raise TrialFailed(found[0].reason, f"predicted before launch: {found[0].message}")
