"""Token-length distributions (:class:`~tuner.config.DistConfig`) sampled with numpy, stratified.

A capacity step counts a few hundred requests of a stream (a closed loop's middle third,
:func:`tuner.measure.unsteady_indices`), and its capacity in requests/s moves with their mean
length: drawn independently, chat's counted output lengths averaged 125.7 tokens for seed 0
and 128.3 for seed 1 at 470 in flight, and vLLM's defaults on the simulator measured 70.5-73.0
req/s on seed 0's stream against 68.7-69.6 on seed 1's (2026-12-05, 3 fresh servers each,
docs/sim-calibration.md "One capacity per stream"): the confirm stage, which replays another
seed, read the defaults 2-4 % below the search. So the lengths are *stratified*: each run of
:data:`BLOCK` consecutive requests takes one value from each of ``BLOCK`` equal-probability
strata of the distribution (inverse CDF of ``(stratum + U) / BLOCK``), in random order. Any
window of whole blocks then has the distribution's mean and spread up to the strata's width,
and the order within a block is as random as independent draws (the clumps of long requests a
p95 sees are kept below the scale of a block).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from tuner.config import DistConfig
from tuner.errors import ConfigError

__all__ = ["BLOCK", "sample_lengths", "stratified_integers", "stratified_uniforms"]

BLOCK = 16
"""Values per stratified block. A window cut across blocks holds part of a block at each end, a
random subset of its strata, and a block of many strata has a wide tail stratum (a log-normal's
top 1/64 spans hundreds of tokens). The text and output tokens of the 470 requests a chat
capacity step counts at 470 in flight varied between 20 seeds by 2.14 / 1.47 % (standard
deviation) drawn independently, 0.85 / 0.25 % in blocks of 8, 0.59 / 0.21 % of 16, 0.88 / 0.33 %
of 32, 0.99 / 0.44 % of 64; long_docs' at 24 in flight, 4.08 / 2.10 % independently, 0.94 /
0.68 % in blocks of 16 (``benchmarks/capacity_streams.py``, 2026-12-05)."""


_EDGE = 1e-9
"""Uniforms are kept this far inside (0, 1), where the normal's inverse CDF is finite."""


def stratified_uniforms(n: int, rng: np.random.Generator, block: int | None = None) -> np.ndarray:
    """``n`` numbers in (0, 1): each run of ``block`` consecutive ones (the last one possibly
    short: a random subset of the strata) has one in each ``1/block``-wide stratum, in random
    order."""
    if n <= 0:
        return np.empty(0)
    block = block or BLOCK
    blocks = -(-n // block)
    strata = rng.permuted(np.tile(np.arange(block), (blocks, 1)), axis=1)
    u = (strata + rng.random((blocks, block))) / block
    return np.clip(u.ravel()[:n], _EDGE, 1.0 - _EDGE)


def stratified_integers(low: int, high: int, n: int, rng: np.random.Generator) -> list[int]:
    """``n`` integers uniform in ``low..high``, stratified (:func:`stratified_uniforms`): each
    block holds every value as often as the block allows."""
    u = stratified_uniforms(n, rng)
    span = high - low + 1
    return [int(v) for v in np.minimum(low + np.floor(u * span), high)]


def sample_lengths(
    d: DistConfig, n: int, rng: np.random.Generator, *, stratified: bool = True
) -> list[int]:
    """``n`` integer lengths drawn from ``d``, stratified in blocks (module doc; else drawn
    independently, as before 2026-12-05: ``workload.stratify=false``), rounded and clipped to
    ``[d.low, d.high]``.

    ``fixed``: ``mean``; ``uniform``: integers in ``low..high``; ``normal``: N(mean, std);
    ``lognormal``: a log-normal whose own mean and standard deviation are ``mean`` and ``std``.
    """
    if n <= 0:
        return []
    low, high = int(d.low), int(d.high)
    if d.kind == "fixed":
        values = np.full(n, float(d.mean))
    elif d.kind == "uniform":
        if not stratified:
            return [int(v) for v in rng.integers(low, high + 1, size=n)]
        return stratified_integers(low, high, n, rng)
    elif d.kind == "normal":
        values = d.mean + max(d.std, 0.0) * _standard_normals(n, rng, stratified)
    elif d.kind == "lognormal":
        if d.mean <= 0:
            raise ConfigError(f"lognormal length mean is {d.mean}; allowed: > 0")
        sigma2 = math.log1p((max(d.std, 0.0) / d.mean) ** 2)
        mu = math.log(d.mean) - sigma2 / 2
        values = np.exp(mu + math.sqrt(sigma2) * _standard_normals(n, rng, stratified))
    else:
        raise ConfigError(
            f"length distribution kind is {d.kind!r}; allowed: fixed, uniform, normal, lognormal"
        )
    return [int(v) for v in np.clip(np.rint(values), low, high)]


def _standard_normals(n: int, rng: np.random.Generator, stratified: bool) -> np.ndarray:
    """``n`` standard normal values: at stratified uniforms' quantiles, or drawn independently
    (numpy's ``normal`` and ``lognormal`` draw these and scale them the same way: the streams of
    ``workload.stratify=false`` are those of before 2026-12-05, value for value)."""
    if stratified:
        return _normal_quantiles(stratified_uniforms(n, rng))
    return rng.standard_normal(n)


def _normal_quantiles(u: np.ndarray) -> np.ndarray:
    """The standard normal's inverse CDF at each of ``u`` (numpy has none; the standard
    library's is exact to double precision)."""
    inv = NormalDist().inv_cdf
    return np.array([inv(float(p)) for p in u])
