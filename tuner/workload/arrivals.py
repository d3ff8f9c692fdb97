"""Open-loop arrival schedules (:class:`~tuner.config.ArrivalConfig`)."""

from __future__ import annotations

import numpy as np

from tuner.config import ArrivalConfig
from tuner.errors import ConfigError

__all__ = ["arrival_gaps", "arrival_times", "ramp_rate"]

_KINDS = "concurrency, poisson, gamma, constant, ramp"


def _unit_gaps(burstiness: float, n: int, rng: np.random.Generator) -> np.ndarray:
    if burstiness <= 0:
        raise ConfigError(f"workload.arrival.burstiness is {burstiness}; allowed: > 0")
    return rng.gamma(shape=burstiness, scale=1.0 / burstiness, size=n)


def _ramp_rates(a: ArrivalConfig) -> tuple[float, float]:
    r0, r1 = a.ramp_start_rate, a.ramp_end_rate
    if r0 is None or r0 < 0:
        raise ConfigError(f"workload.arrival.ramp_start_rate is {r0}; allowed: >= 0 requests/s")
    if r1 is None or r1 <= 0:
        raise ConfigError(f"workload.arrival.ramp_end_rate is {r1}; allowed: > 0 requests/s")
    return float(r0), float(r1)


def _ramp_span(a: ArrivalConfig, n: int) -> float:
    """The ramp's length in seconds: the expected send time of the last of ``n`` requests."""
    r0, r1 = _ramp_rates(a)
    return 2.0 * max(n - 1, 1) / (r0 + r1)


def ramp_rate(a: ArrivalConfig, n: int, t: float) -> float:
    """The ``ramp`` schedule's request rate at ``t`` s for ``n`` measured requests: linear from
    ``ramp_start_rate`` at 0 to ``ramp_end_rate`` at the ramp's end, then ``ramp_end_rate``."""
    r0, r1 = _ramp_rates(a)
    span = _ramp_span(a, n)
    return r1 if t >= span else r0 + (r1 - r0) * max(t, 0.0) / span


def _ramp_times(a: ArrivalConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """Send times of a linear-in-time rate ramp, by time rescaling.

    The rate is r(t) = r0 + (r1 - r0) t / T up to T = 2 (n - 1) / (r0 + r1), where the expected
    number of arrivals reaches n - 1 (so the last request is due at T), and r1 after that. A
    renewal process of unit rate (gamma gaps, shape ``burstiness``, mean 1; Poisson at 1) is
    mapped through the inverse of the cumulative rate L(t) = r0 t + (r1 - r0) t^2 / (2 T).
    """
    r0, r1 = _ramp_rates(a)
    span = _ramp_span(a, n)
    s = np.concatenate(([0.0], np.cumsum(_unit_gaps(a.burstiness, n - 1, rng))))
    half_slope = (r1 - r0) / (2.0 * span)
    total = r0 * span + half_slope * span * span  # L(T) = n - 1
    inside = np.minimum(s, total)
    disc = np.sqrt(np.maximum(r0 * r0 + 4.0 * half_slope * inside, 0.0))
    denom = r0 + disc
    # t = 2 s / (r0 + sqrt(r0^2 + 4 a s)): the stable root of a t^2 + r0 t - s = 0, any sign of a
    t = np.divide(2.0 * inside, denom, out=np.zeros_like(inside), where=denom > 0)
    return np.where(s > total, span + (s - total) / r1, t)


def arrival_gaps(a: ArrivalConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` inter-arrival gaps in seconds for an open-loop arrival kind.

    ``poisson``: exponential(1/rate); ``gamma``: gamma(shape=burstiness, scale=1/(rate*burstiness))
    as ``vllm bench serve`` draws them (burstiness 1 is Poisson, < 1 burstier, > 1 smoother);
    ``constant``: exactly 1/rate; ``ramp``: the gaps of :func:`arrival_times` for ``n + 1``
    requests (the rate changes linearly in time, see ``_ramp_times``).
    """
    if a.kind == "ramp":
        return np.diff(_ramp_times(a, n + 1, rng)) if n > 0 else np.zeros(0)
    if a.rate <= 0:
        raise ConfigError(f"workload.arrival.rate is {a.rate}; allowed: > 0 requests/s")
    if a.kind == "poisson":
        return rng.exponential(1.0 / a.rate, size=n)
    if a.kind == "gamma":
        if a.burstiness <= 0:
            raise ConfigError(f"workload.arrival.burstiness is {a.burstiness}; allowed: > 0")
        return rng.gamma(shape=a.burstiness, scale=1.0 / (a.rate * a.burstiness), size=n)
    if a.kind == "constant":
        return np.full(n, 1.0 / a.rate)
    raise ConfigError(f"workload.arrival.kind is {a.kind!r}; allowed: {_KINDS}")


def arrival_times(a: ArrivalConfig, n: int, rng: np.random.Generator) -> list[float] | None:
    """Send times (s after the replay start) for ``n`` requests; ``None`` for closed loop.

    The first request goes at 0; request ``i`` at the sum of the first ``i`` gaps. For ``ramp``
    the rate rises (or falls) linearly in time from ``ramp_start_rate`` at the first request to
    ``ramp_end_rate`` at the (expected) last one, like ``vllm bench serve --ramp-up-strategy
    linear``.
    """
    if a.kind == "concurrency":
        return None
    if n <= 0:
        return []
    if a.kind == "ramp":
        return [float(t) for t in _ramp_times(a, n, rng)]
    gaps = arrival_gaps(a, n, rng)
    times = np.concatenate(([0.0], np.cumsum(gaps[:-1])))
    return [float(t) for t in times]
