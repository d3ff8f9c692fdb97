"""Stage 5 — score: request records → metrics → objective values and constraints.

Definitions follow ``vllm bench serve`` (vLLM 0.24.0's ``vllm/benchmarks/serve.py``,
``calculate_metrics``, and ``vllm/benchmarks/lib/endpoint_request_func.py``:
https://github.com/vllm-project/vllm/tree/v0.24.0/vllm/benchmarks): TTFT to the first
content chunk, ITL between content chunks, TPOT = (e2e − ttft)/(output − 1), throughput over the
span from the first send to the last completion, goodput = requests/s meeting every SLO set.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from tuner.config import DIRECTIONS, ObjectiveConfig, SLOConfig, TunerConfig, one_of
from tuner.errors import ConfigError, FailureReason
from tuner.records import RequestRecord, TrialResult

__all__ = [
    "CAPACITY_METRICS",
    "KEY_METRICS",
    "METRICS",
    "OBJECTIVES",
    "PER_GPU",
    "PERCENTILES",
    "capacity_metric",
    "check",
    "constraints",
    "needs_capacity",
    "failure_values",
    "mean_result",
    "objective_metric",
    "objective_values",
    "PruneWatch",
    "prune_reason",
    "slo_margins",
    "summarize",
]

CAPACITY_METRICS = (
    "capacity_rps",
    "capacity_rps_low",
    "capacity_rps_high",
    "capacity_factor",
    "capacity_factor_high",
    "capacity_steps",
    "capacity_censored",
    "capacity_per_gpu_rps",
)
"""What :meth:`tuner.capacity.Capacity.metrics` records on a trial (the last, :data:`PER_GPU`,
given the GPUs)."""

PER_GPU = "capacity_per_gpu_rps"
"""The SLO capacity per GPU the server used: ``capacity_rps`` / (TP × DP), the measure that
compares GPU layouts (one GPU, TP=2, DP=2) at equal hardware."""

OBJECTIVES = ("capacity_rps", PER_GPU)
"""The objective metrics that need the capacity search (:func:`objective_metric`)."""


def objective_metric(metrics: Sequence[str]) -> str | None:
    """The first of ``metrics`` (an objective's, in order) that is a capacity
    (:data:`OBJECTIVES`), or None: what the study's best capacity, the incumbent probe and the
    confirm stage's ``capacity`` pick rank by."""
    return next((m for m in metrics if m in OBJECTIVES), None)


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
    + list(CAPACITY_METRICS)
)

KEY_METRICS: tuple[str, ...] = (
    "goodput",
    "output_throughput",
    "request_throughput",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "e2e_p95_ms",
    "error_rate",
)
"""The metrics that sum a run up, in this order: what the confirm stage reports for each run and
the simulator's landscape predicts for the prescreen (all of them but E2E)."""


def check(cfg: TunerConfig) -> None:
    """``objective``: each objective a metric of :data:`METRICS` with a direction; the SLO
    percentile and the error-rate limit in range (else ConfigError, one line)."""
    o = cfg.objective
    if not o.objectives:
        raise ConfigError("objective.objectives is empty; name at least one metric")
    for spec in o.objectives:
        one_of("objective direction", spec.direction, DIRECTIONS)
        one_of("objective metric", spec.metric, tuple(sorted(METRICS)))
    if o.slo_percentile not in (50, 90, 95, 99):
        raise ConfigError(
            f"objective.slo_percentile is {o.slo_percentile}; allowed: 50, 90, 95, 99"
        )
    if not 0.0 <= o.max_error_rate <= 1.0:
        raise ConfigError(f"objective.max_error_rate is {o.max_error_rate}; allowed: 0.0 to 1.0")
    if needs_capacity(o):
        slo = cfg.workload.slo
        if slo.ttft_ms is None and slo.tpot_ms is None and slo.e2e_ms is None:
            raise ConfigError(
                f"objective {capacity_metric(o)} needs the workload's SLOs; set "
                "workload.slo.ttft_ms, tpot_ms or e2e_ms"
            )
        c = o.capacity
        if not 0.0 < c.rel_width < 1.0:
            raise ConfigError(f"objective.capacity.rel_width is {c.rel_width}; allowed: 0 < x < 1")
        if c.max_steps < 2:
            raise ConfigError(f"objective.capacity.max_steps is {c.max_steps}; allowed: >= 2")
        if not 0.0 < c.min_factor <= 1.0 <= c.max_factor:
            raise ConfigError(
                f"objective.capacity.min_factor {c.min_factor} and max_factor {c.max_factor}; "
                "allowed: 0 < min_factor <= 1 <= max_factor"
            )
        if c.requests is not None and c.requests < 1:
            raise ConfigError(f"objective.capacity.requests is {c.requests}; allowed: >= 1")


def needs_capacity(objective: ObjectiveConfig) -> bool:
    """An objective is the SLO capacity (``capacity_rps`` or ``capacity_per_gpu_rps``): each
    trial runs the capacity search."""
    return capacity_metric(objective) is not None


def capacity_metric(objective: ObjectiveConfig) -> str | None:
    """The objective's first capacity metric (:func:`objective_metric`), or None."""
    return objective_metric([o.metric for o in objective.objectives])


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


def _slos(slo: SLOConfig) -> list[tuple[str, float]]:
    pairs = (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2e", slo.e2e_ms))
    return [(m, lim) for m, lim in pairs if lim is not None]


def constraints(
    metrics: dict[str, float],
    failure_reason: str | None,
    objective: ObjectiveConfig,
    slo: SLOConfig,
) -> dict[str, float]:
    """Optuna constraints (> 0 violated), the same keys for every trial of a study.

    ``failed_<reason>`` per failure class (1 for the trial's class), ``error_rate`` (share of
    failed requests over the budget) and, if enabled, ``slo_<ttft|tpot|e2e>`` = percentile/SLO − 1.
    A trial without a measurement violates every SLO.
    """
    out = {f"failed_{r.value}": float(failure_reason == r.value) for r in FailureReason}
    out["error_rate"] = metrics.get("error_rate", 1.0) - objective.max_error_rate
    if objective.slo_constraints:
        for m, room in slo_margins(metrics, objective, slo).items():
            ok = failure_reason is None and room is not None
            # 0.0 - room: value/limit - 1 exactly, and 0.0 (not -0.0) at the limit
            out[f"slo_{m}"] = 0.0 - room if ok and room is not None else 1.0
    return out


def slo_margins(
    metrics: Mapping[str, float], objective: ObjectiveConfig, slo: SLOConfig
) -> dict[str, float | None]:
    """Each SLO's relative headroom at ``objective.slo_percentile``: ``1 − value / limit``
    (≥ 0: the SLO holds), None where the metric has no sample; SLOs not set are left out. The
    one rule of "an SLO holds": the constraints ``slo_*`` (:func:`constraints`) are its
    negation, the capacity search's margin (:func:`tuner.capacity_probe.margin`) its minimum.

    With ``slo_percentile=95``, ``ttft_ms=200`` and ``tpot_ms=50``: ``{"ttft_p95_ms": 150.0}``
    gives ``{"ttft": 0.25, "tpot": None}``.
    """
    q = objective.slo_percentile
    out: dict[str, float | None] = {}
    for m, limit in _slos(slo):
        value = metrics.get(f"{m}_p{q}_ms")
        out[m] = None if value is None else 1.0 - float(value) / float(limit)
    return out


_SPREAD = ("goodput", "output_throughput")


def mean_result(
    results: list[TrialResult], objective: ObjectiveConfig, slo: SLOConfig
) -> TrialResult:
    """One trial's repeats (``study.repeats``) as one result: a failure or a prune decides (the
    first one); else every metric is the mean over the repeats, with the objectives and
    constraints recomputed from those means and ``<metric>_spread`` = (max - min) / mean for
    goodput and output tok/s."""
    bad = next((r for r in results if r.failure_reason or r.pruned), None)
    if bad is not None or len(results) == 1:
        return bad or results[0]
    keys = set.intersection(*(set(r.metrics) for r in results))
    metrics = {k: statistics.fmean(r.metrics[k] for r in results) for k in sorted(keys)}
    for k in _SPREAD:
        vals = [r.metrics[k] for r in results if k in r.metrics]
        if vals and metrics.get(k):
            metrics[f"{k}_spread"] = (max(vals) - min(vals)) / metrics[k]
    metrics["repeats"] = float(len(results))
    return replace(
        results[0],
        metrics=metrics,
        values=objective_values(metrics, objective),
        constraints=constraints(metrics, None, objective, slo),
        duration_s=results[-1].duration_s,
    )


def prune_reason(
    records: Sequence[RequestRecord], total: int, objective: ObjectiveConfig, slo: SLOConfig
) -> str | None:
    """Why the replay can stop now: a constraint is already lost whatever the remaining requests
    do. ``total`` is the number of measured requests the replay will send."""
    watch = PruneWatch(total, objective, slo)
    for r in records:
        watch.count(r)
    return watch.reason()


@dataclass(frozen=True)
class Sends:
    """How a closed loop sends its requests, for :class:`PruneWatch` to know which counted ones
    are running: ``order``, the measured requests' indices in the order the loop sends them (its
    slots, ``served_at_most``'s requests in flight, go at once, then one each time a request
    comes back); ``until_s``, the replay's time after which nothing is sent; ``slack_s``, how
    long after a request came back its slot's next one may still be sent (the client's own lag),
    both in the engine's seconds."""

    order: Sequence[int]
    until_s: float
    slack_s: float


class PruneWatch:
    """:func:`prune_reason` kept up to date record by record (:meth:`add`), in constant time per
    record (with ``sends``, once lost: the running requests, at most the slots): a replay asks
    after each of its up to a few thousand records, and recounting them all each time was
    quadratic. Records whose index is in ``skip`` (a closed loop's start and end in
    the capacity search's steps: :func:`tuner.measure.unsteady_indices`) and warm-ups are not
    counted.

    ``served_at_most``: (a closed loop's requests in flight, requests/s): a lost replay stops only
    once it cannot serve more than that rate by Little's law (in flight over the counted requests'
    mean E2E, as :func:`tuner.capacity_probe.step_of` reads it). The E2E of the counted requests
    finished so far, summed over all ``total``, is a lower bound on that mean (the rest add
    E2E ≥ 0; failed ones are left out of the mean), so the bound only grows.

    ``sends`` (:class:`Sends`, only with ``served_at_most``) adds the counted requests still in
    flight: each has run at least since it was sent, so its E2E is at least that long. A closed
    loop sends its next request when one finishes, so once k records came back the loop's
    ordinal ``slots + k − 1`` (the slots: the requests in flight) was sent, at the latest at
    that moment (``now_s`` of :meth:`add`) plus :attr:`Sends.slack_s`. A request counts at most
    ``in flight / rate`` s (the mean E2E the rate needs), so one that fails later, and is left
    out of the mean, cannot make the bound unsound: with ``b = in flight / rate``, ``Σ finished
    E2E + Σ min(running for, b) ≥ total × b`` implies a mean of at least ``b`` over the requests
    that end well."""

    def __init__(
        self,
        total: int,
        objective: ObjectiveConfig,
        slo: SLOConfig,
        skip: frozenset[int] = frozenset(),
        served_at_most: tuple[int, float] | None = None,
        sends: Sends | None = None,
    ) -> None:
        self.total, self.objective, self.skip = total, objective, skip
        self.served_at_most = served_at_most
        self.sends = sends
        self.slos = _slos(slo)
        self.failed = 0
        self.over = [0] * len(self.slos)
        self.e2e_s = 0.0  # the counted requests' E2E so far
        self.back = 0  # measured records come back so far
        self.counted = frozenset(sends.order) - skip if sends is not None else frozenset()
        self.sent_by: dict[int, float] = {}  # counted and running: the latest it was sent
        self.ended: set[int] = set()  # counted, came back before its send was inferred

    def count(self, r: RequestRecord) -> None:
        if r.warmup or r.index in self.skip:
            return
        if r.status != "ok":
            self.failed += 1
            return
        self.e2e_s += r.e2e_s or 0.0
        for k, (m, limit) in enumerate(self.slos):
            v = {"ttft": r.ttft_s, "tpot": r.tpot_s, "e2e": r.e2e_s}[m]
            self.over[k] += v is not None and v * 1000.0 > limit

    def add(self, r: RequestRecord, now_s: float | None = None) -> str | None:
        """Count ``r``; the reason to stop now, if any. ``now_s``: the replay's time as ``r``
        came back (its start 0, the engine's seconds), for :attr:`sends`."""
        self.count(r)
        if self.sends is not None and not r.warmup:
            self._sent(r, now_s)
        return self.reason(now_s)

    def _sent(self, r: RequestRecord, now_s: float | None) -> None:
        """``r`` is no longer running; the send the k-th record back freed a slot for."""
        sends = self.sends
        assert sends is not None
        assert self.served_at_most is not None  # a closed loop's slots
        if r.index in self.counted and self.sent_by.pop(r.index, None) is None:
            self.ended.add(r.index)
        self.back += 1
        ordinal = self.served_at_most[0] + self.back - 1
        if now_s is None or ordinal >= len(sends.order):
            return
        sent_by = now_s + sends.slack_s
        index = sends.order[ordinal]
        if sent_by > sends.until_s or index not in self.counted:
            return  # past the replay's time no request is sent; uncounted ones add nothing
        if index in self.ended:
            self.ended.discard(index)
        else:
            self.sent_by[index] = sent_by

    def reason(self, now_s: float | None = None) -> str | None:
        lost = self._lost()
        if lost is None or self.served_at_most is None:
            return lost
        in_flight, ceiling = self.served_at_most
        e2e_s = self.e2e_s
        need = in_flight / ceiling if ceiling > 0 else math.inf  # the mean E2E it needs
        if e2e_s < self.total * need and now_s is not None and self.sent_by:
            e2e_s += sum(min(max(0.0, now_s - t), need) for t in self.sent_by.values())
        top = in_flight * self.total / e2e_s if e2e_s > 0 else math.inf
        if top > ceiling:
            return None  # it may yet serve more: replayed on
        return f"{lost}; it serves at most {top:.4g} req/s, not above {ceiling:.4g}"

    def _lost(self) -> str | None:
        objective, total = self.objective, self.total
        if not objective.prune or total <= 0:
            return None
        if self.failed > objective.max_error_rate * total:
            budget = f"{objective.max_error_rate:.0%}"
            return f"{self.failed} of {total} requests failed (budget {budget})"
        if not objective.slo_constraints:
            return None
        allowed = (1.0 - objective.slo_percentile / 100.0) * total
        for (m, limit), over in zip(self.slos, self.over, strict=True):
            if over > allowed + 1:
                return (
                    f"{over} of {total} requests over the {m.upper()} SLO of {limit:g} ms: "
                    f"p{objective.slo_percentile} cannot meet it"
                )
        return None
