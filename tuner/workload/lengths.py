"""Token-length distributions (:class:`~tuner.config.DistConfig`) sampled with numpy."""

from __future__ import annotations

import math

import numpy as np

from tuner.config import DistConfig
from tuner.errors import ConfigError

__all__ = ["sample_lengths"]


def sample_lengths(d: DistConfig, n: int, rng: np.random.Generator) -> list[int]:
    """``n`` integer lengths drawn from ``d``, rounded and clipped to ``[d.low, d.high]``.

    ``fixed``: ``mean``; ``uniform``: integers in ``low..high``; ``normal``: N(mean, std);
    ``lognormal``: a log-normal whose own mean and standard deviation are ``mean`` and ``std``.
    """
    if n <= 0:
        return []
    low, high = int(d.low), int(d.high)
    if d.kind == "fixed":
        values = np.full(n, float(d.mean))
    elif d.kind == "uniform":
        values = rng.integers(low, high + 1, size=n).astype(float)
    elif d.kind == "normal":
        values = rng.normal(d.mean, max(d.std, 0.0), size=n)
    elif d.kind == "lognormal":
        if d.mean <= 0:
            raise ConfigError(f"lognormal length mean is {d.mean}; allowed: > 0")
        sigma2 = math.log1p((max(d.std, 0.0) / d.mean) ** 2)
        mu = math.log(d.mean) - sigma2 / 2
        values = rng.lognormal(mu, math.sqrt(sigma2), size=n)
    else:
        raise ConfigError(
            f"length distribution kind is {d.kind!r}; allowed: fixed, uniform, normal, lognormal"
        )
    return [int(v) for v in np.clip(np.rint(values), low, high)]
