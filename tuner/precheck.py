"""Stage 2 — precheck: failures that are certain before launch, told to Optuna without a server.

Three kinds, each with the reason vLLM itself would give:

* the tuner's own limits — TP larger than the GPU lease or not dividing the attention heads, a
  ``max_model_len`` shorter than more than the error budget of the workload's requests
  (``precheck``);
* vLLM 0.24's config validation (vllm-facts.md §2) — chunked prefill off with
  ``max_num_batched_tokens < max_model_len``; ``max_num_batched_tokens < max_num_seqs`` when both
  are passed; a block size that is not a multiple of 16 (no Hopper attention backend takes it,
  §1.4) (``invalid_config``);
* memory (``tuner.memory``, the simulator's model) — no KV memory at all, or less than one
  ``max_model_len`` request needs (``no_kv_memory`` / ``kv_too_small``) — but only when the
  predicted deficit exceeds the model's error margin, so borderline configs still launch.

The margin: ``0.5 GiB + 2 %`` of the gmu budget. On the H200 the model was within 1.4 % of vLLM's
logged KV tokens for Qwen3-8B (docs/gpu-runs/2026-11-30-h200.md); at gmu 0.92 2 % is 2.6 GiB.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.config import TunerConfig
from tuner.errors import FailureReason, TrialFailed
from tuner.memory import GPU_PROFILES, GiB, MemoryEstimate, ModelShape, estimate
from tuner.records import RequestSpec

__all__ = ["MARGIN_FRACTION", "MARGIN_GIB", "Verdict", "precheck"]

MARGIN_GIB = 0.5
MARGIN_FRACTION = 0.02


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
    _tuner_limits(cfg, shape, params, requests)
    if veto and not baseline:
        _vllm_validation(params)
    gpu = GPU_PROFILES.get(cfg.engine.gpu)
    if gpu is None:
        return Verdict(None)
    try:
        est = estimate(shape, gpu, params)
    except (ValueError, KeyError, TypeError, ZeroDivisionError):
        return Verdict(None)
    if veto and est.failure is not None and _certain(est):
        raise TrialFailed(est.failure, f"predicted before launch: {est.message}")
    return Verdict(est)


def _certain(est: MemoryEstimate) -> bool:
    """The predicted deficit is larger than the model's error margin."""
    need_gib = est.bytes_per_token * max(est.max_model_len, 1) / GiB
    if est.failure is FailureReason.NO_KV_MEMORY:
        deficit = max(-est.kv_gib, 0.0) + need_gib
    else:
        deficit = need_gib - est.kv_gib
    return deficit > MARGIN_GIB + MARGIN_FRACTION * est.budget_gib


def _tuner_limits(
    cfg: TunerConfig, shape: ModelShape, params: Mapping[str, Any], requests: Sequence[RequestSpec]
) -> None:
    tp = int(params.get("tensor_parallel_size") or 1)
    if tp > len(cfg.engine.gpus):
        raise TrialFailed(
            FailureReason.PRECHECK,
            f"tensor_parallel_size {tp} exceeds the GPU lease {cfg.engine.gpus}",
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


def _vllm_validation(params: Mapping[str, Any]) -> None:
    """vLLM 0.24's SchedulerConfig checks on explicitly passed values (vllm-facts.md §2)."""
    mnbt = params.get("max_num_batched_tokens")
    mml = params.get("max_model_len")
    seqs = params.get("max_num_seqs")
    chunked = params.get("enable_chunked_prefill")
    if chunked is False and isinstance(mnbt, int) and isinstance(mml, int) and mnbt < mml:
        raise TrialFailed(
            FailureReason.INVALID_CONFIG,
            f"predicted before launch: max_num_batched_tokens ({mnbt}) is smaller than "
            f"max_model_len ({mml}) with chunked prefill off",
        )
    block = params.get("block_size")
    if isinstance(block, int) and block % 16:
        raise TrialFailed(
            FailureReason.INVALID_CONFIG,
            f"predicted before launch: block_size {block} is not a multiple of 16, which every "
            "attention backend on Hopper needs (No valid attention backend found)",
        )
    if isinstance(mnbt, int) and isinstance(seqs, int) and mnbt < seqs:
        raise TrialFailed(
            FailureReason.INVALID_CONFIG,
            f"predicted before launch: max_num_batched_tokens ({mnbt}) must be greater than or "
            f"equal to max_num_seqs ({seqs})",
        )
