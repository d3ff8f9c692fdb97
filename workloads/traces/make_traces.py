"""Generate the two sample traces in this folder (seeded; nothing is downloaded).

``python workloads/traces/make_traces.py`` rewrites ``guidellm_sample.csv`` (GuideLLM's layout:
``timestamp,input_length,output_length``, seconds) and ``azure_sample.csv`` (the Azure LLM
inference trace layout: ``TIMESTAMP,ContextTokens,GeneratedTokens``, datetimes with 7
fractional digits). 200 rows each. Arrivals come from a two-state Markov-modulated Poisson
process (calm 2 req/s for ~8 s, bursts of 15 req/s for ~2 s), so gaps are bursty; token counts
are log-normal (mean/std given below), clipped and rounded.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROWS = 200


def mmpp_times(rng: np.random.Generator, n: int) -> np.ndarray:
    """Arrival times (s) of a two-state MMPP: (rate req/s, mean state duration s)."""
    states = [(2.0, 8.0), (15.0, 2.0)]
    times: list[float] = []
    t, state = 0.0, 0
    end = rng.exponential(states[state][1])
    while len(times) < n:
        rate, _ = states[state]
        gap = rng.exponential(1.0 / rate)
        if t + gap > end:  # memoryless: restart the draw in the next state
            t, state = end, 1 - state
            end = t + rng.exponential(states[state][1])
            continue
        t += gap
        times.append(t)
    out = np.asarray(times)
    return out - out[0]


def lognormal(rng: np.random.Generator, mean: float, std: float, n: int, lo: int, hi: int):
    sigma2 = math.log1p((std / mean) ** 2)
    values = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), size=n)
    return np.clip(np.rint(values), lo, hi).astype(int)


def guidellm(rng: np.random.Generator) -> str:
    t = mmpp_times(rng, ROWS)
    ins = lognormal(rng, 600, 500, ROWS, 16, 4096)
    outs = lognormal(rng, 180, 150, ROWS, 8, 1024)
    lines = ["timestamp,input_length,output_length"]
    lines += [f"{a:.6f},{i},{o}" for a, i, o in zip(t, ins, outs, strict=True)]
    return "\n".join(lines) + "\n"


def azure(rng: np.random.Generator) -> str:
    t = mmpp_times(rng, ROWS)
    ins = lognormal(rng, 1000, 900, ROWS, 8, 8000)
    outs = lognormal(rng, 250, 200, ROWS, 4, 1500)
    start = datetime(2023, 11, 16, 18, 15, 46)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for a, i, o in zip(t, ins, outs, strict=True):
        ticks = round(a * 10_000_000) + 6_805_900  # 100 ns ticks, first row at .6805900
        moment = start + timedelta(seconds=ticks // 10_000_000)
        lines.append(f"{moment:%Y-%m-%d %H:%M:%S}.{ticks % 10_000_000:07d},{i},{o}")
    return "\n".join(lines) + "\n"


def main() -> None:
    g, a = (np.random.default_rng(s) for s in np.random.SeedSequence(20240601).spawn(2))
    (HERE / "guidellm_sample.csv").write_text(guidellm(g), encoding="utf-8")
    (HERE / "azure_sample.csv").write_text(azure(a), encoding="utf-8")


if __name__ == "__main__":
    main()
