"""Stage 5 — score: request records → metrics → objective values and constraints.

Definitions follow ``vllm bench serve`` (shared/research/vllm-facts.md §8.1): TTFT to the first
content chunk, ITL between content chunks, TPOT = (e2e − ttft)/(output − 1), throughput over the
span from the first send to the last completion, goodput = requests/s meeting every SLO set.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tuner.config import ObjectiveConfig, SLOConfig
from tuner.records import RequestRecord

__all__ = ["METRICS", "PERCENTILES", "failure_values", "objective_values", "summarize"]

PERCENTILES = (50, 90, 95, 99)
_LATENCIES = ("ttft", "tpot", "itl", "e2e")

METRICS: frozenset[str] = frozenset(
    [
        "output_throughput",
        "total_token_throughput",
        "request_throughput",
        "goodput",
        "success_rate",
        "error_rate",
        "completed",
        "failed",
        "duration_s",
        "prompt_tokens_mean",
        "output_tokens_mean",
    ]
    + [f"{m}_{s}_ms" for m in _LATENCIES for s in ("mean", *(f"p{p}" for p in PERCENTILES))]
)


def _stats(name: str, values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values, dtype=float) * 1000.0
    out = {f"{name}_mean_ms": float(arr.mean())}
    for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES), strict=True):
        out[f"{name}_p{p}_ms"] = float(v)
    return out


def _meets(r: RequestRecord, slo: SLOConfig) -> bool:
    checks = (
        (slo.ttft_ms, r.ttft_s),
        (slo.tpot_ms, r.tpot_s if r.tpot_s is not None else 0.0),
        (slo.e2e_ms, r.e2e_s),
    )
    return all(lim is None or (v is not None and v * 1000.0 <= lim) for lim, v in checks)


def summarize(records: Sequence[RequestRecord], slo: SLOConfig) -> dict[str, float]:
    """Metrics over the measured (non-warm-up) records. Empty-sample latencies are left out."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.status == "ok"]
    n = len(measured)
    out: dict[str, float] = {
        "completed": float(len(ok)),
        "failed": float(n - len(ok)),
        "success_rate": len(ok) / n if n else 0.0,
        "error_rate": (n - len(ok)) / n if n else 1.0,
    }
    if not ok:
        out.update(output_throughput=0.0, total_token_throughput=0.0, request_throughput=0.0)
        out.update(goodput=0.0, duration_s=0.0)
        return out
    start = min(r.t_sent_s for r in measured)
    end = max(r.t_sent_s + (r.e2e_s or 0.0) for r in ok)
    duration = max(end - start, 1e-9)
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    out.update(
        duration_s=duration,
        output_throughput=out_tokens / duration,
        total_token_throughput=(out_tokens + in_tokens) / duration,
        request_throughput=len(ok) / duration,
        goodput=sum(_meets(r, slo) for r in ok) / duration,
        prompt_tokens_mean=in_tokens / len(ok),
        output_tokens_mean=out_tokens / len(ok),
    )
    out.update(_stats("ttft", [r.ttft_s for r in ok if r.ttft_s is not None]))
    out.update(_stats("tpot", [t for r in ok if (t := r.tpot_s) is not None]))
    out.update(_stats("itl", [g for r in ok for g in r.itl_s]))
    out.update(_stats("e2e", [r.e2e_s for r in ok if r.e2e_s is not None]))
    return out


def objective_values(metrics: dict[str, float], objective: ObjectiveConfig) -> tuple[float, ...]:
    """Objective values in config order; a metric with no samples gets its worst value."""
    worst = failure_values(objective)
    return tuple(
        float(metrics[o.metric]) if o.metric in metrics else w
        for o, w in zip(objective.objectives, worst, strict=True)
    )


def failure_values(objective: ObjectiveConfig) -> tuple[float, ...]:
    """Placeholder values for a trial that produced no measurement (it is also marked infeasible
    through a violated constraint, which is what the samplers act on): 0 for a maximised metric, a
    large latency/penalty for a minimised one."""
    return tuple(0.0 if o.direction == "maximize" else 1e7 for o in objective.objectives)
