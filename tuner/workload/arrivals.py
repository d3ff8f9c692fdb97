"""Open-loop arrival schedules (:class:`~tuner.config.ArrivalConfig`)."""

from __future__ import annotations

import numpy as np

from tuner.config import ArrivalConfig
from tuner.errors import ConfigError

__all__ = ["arrival_gaps", "arrival_times"]


def arrival_gaps(a: ArrivalConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` inter-arrival gaps in seconds for an open-loop arrival kind.

    ``poisson``: exponential(1/rate); ``gamma``: gamma(shape=burstiness, scale=1/(rate*burstiness))
    as ``vllm bench serve`` draws them (burstiness 1 is Poisson, < 1 burstier, > 1 smoother);
    ``constant``: exactly 1/rate.
    """
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
    raise ConfigError(
        f"workload.arrival.kind is {a.kind!r}; allowed: concurrency, poisson, gamma, constant"
    )


def arrival_times(a: ArrivalConfig, n: int, rng: np.random.Generator) -> list[float] | None:
    """Send times (s after the replay start) for ``n`` requests; ``None`` for closed loop.

    The first request goes at 0; request ``i`` at the sum of the first ``i`` gaps.
    """
    if a.kind == "concurrency":
        return None
    if n <= 0:
        return []
    gaps = arrival_gaps(a, n, rng)
    times = np.concatenate(([0.0], np.cumsum(gaps[:-1])))
    return [float(t) for t in times]
