"""The capacity search (tuner.capacity) on many random landscapes: what must hold whatever the
server does. Each landscape is drawn from a seed: a closed loop (whole loads in flight, a
served rate that saturates) or an open one, a noisy SLO margin crossing zero somewhere between
0.3x and 8x, failed steps pruned with some probability (their partial rates anywhere), and a
start that is none, a prediction, a near start or a binding incumbent. The image_heavy server
whose pruned step stood in at 20.97 req/s (docs/gpu-runs/2026-12-07-image-heavy-screen-h100.md)
broke :func:`test_a_pruned_top_never_stands_in_above_its_bounds` in 17 of these 2,000 landscapes
(2026-12-07) with the estimator of that day, the held rate scaled to the load alone."""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from tuner.capacity import Capacity, Start, Step, from_steps, search
from tuner.config import CapacityConfig

SEEDS = range(2000)


@dataclass
class Case:
    cap: Capacity
    settings: CapacityConfig
    start: Start | None


def _landscape(
    rng: random.Random,
) -> tuple[Callable[[float], Awaitable[Step]], Callable[[float], float] | None, bool, float]:
    in_flight = rng.choice([4, 16, 64, 256])
    closed = rng.random() < 0.7
    crossing = rng.uniform(0.3, 8.0)
    slope = rng.uniform(0.2, 1.5)
    noise = rng.choice([0.0, 0.02, 0.1, 0.3])
    top = rng.uniform(1.0, 100.0)
    knee = rng.uniform(0.5, 6.0)
    p_pruned = rng.choice([0.0, 0.5, 1.0])

    def served(f: float) -> float:
        return top * (1 - math.exp(-f / knee)) if closed else top * f

    def whole(f: float) -> float:
        return max(1, math.ceil(in_flight * f - 1e-9)) / in_flight

    async def probe(f: float) -> Step:
        f = whole(f) if closed else f  # a closed loop runs the whole load in flight, as recorded
        margin = slope * (1 - f / crossing) + rng.gauss(0, noise)
        rps = served(f) * (1 + rng.gauss(0, 0.02))
        if margin < 0 and rng.random() < p_pruned:  # a partial replay's rate: anything
            return Step(f, rps * rng.uniform(0.3, 1.3), margin, False, pruned="ttft")
        return Step(f, rps, margin, margin >= 0)

    return probe, (whole if closed else None), closed, crossing


async def _case(seed: int) -> Case:
    rng = random.Random(seed)
    probe, loads, closed, crossing = _landscape(rng)
    settings = CapacityConfig(rel_width=rng.choice([0.05, 0.1, 0.25]), max_steps=rng.randint(2, 10))
    kind = rng.choice(["none", "prediction", "near", "incumbent"])
    f = crossing * rng.uniform(0.5, 1.8)
    start = {
        "none": None,
        "prediction": Start(f, 10.0 * f, binding=False),
        "near": Start(f, 10.0 * f, binding=False, near=True),
        "incumbent": Start(f, 10.0 * f),
    }[kind]
    stop_on_loss = kind == "incumbent" and rng.random() < 0.8
    cap = await search(
        probe, settings, loads=loads, start=start, stop_on_loss=stop_on_loss, closed=closed
    )
    return Case(cap, settings, start)


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    async def all_cases() -> list[Case]:
        return [await _case(seed) for seed in SEEDS]

    return asyncio.run(all_cases())


def test_the_landscapes_reach_every_ending(cases: list[Case]) -> None:
    # the invariants below are worth something only if every way a search ends is among them
    ends = Counter(
        "censored" if c.cap.censored else "capped" if c.cap.capped
        else "nothing held" if c.cap.low == 0 else "bracketed"
        for c in cases
    )  # fmt: skip
    assert len(ends) == 4 and min(ends.values()) >= 10, ends
    tops = [_bracket(c.cap)[1] for c in cases]
    assert sum(top is not None and top.pruned is not None for top in tops) >= 300


def _bracket(cap: Capacity) -> tuple[Step | None, Step | None]:
    """The held step the answer reads from and the lowest failed one above it."""
    held = [s for s in cap.steps if s.held and s.rps == cap.low]
    if not held or cap.censored or cap.low == 0:
        return None, None
    lo = max(held, key=lambda s: s.factor)
    above = [s for s in cap.steps if not s.held and s.factor > lo.factor]
    return lo, min(above, key=lambda s: s.factor, default=None)


def test_every_answer_is_ordered_finite_and_within_its_replays(cases: list[Case]) -> None:
    for c in cases:
        cap, settings = c.cap, c.settings
        assert len(cap.steps) <= settings.max_steps, cap.steps
        values = (cap.rps, cap.low, cap.high, cap.factor)
        assert all(math.isfinite(v) and v >= 0 for v in values), cap
        assert cap.low <= cap.rps <= cap.high, cap
        factors = [s.factor for s in cap.steps]
        assert all(settings.min_factor <= f <= settings.max_factor for f in factors), factors
        assert len(set(factors)) == len(factors), factors  # no load replayed twice


def test_a_bracketed_answer_starts_from_a_rate_that_held(cases: list[Case]) -> None:
    for c in cases:
        if not (c.cap.censored or c.cap.capped or c.cap.low == 0):
            assert any(s.held and s.rps == c.cap.low for s in c.cap.steps), c.cap


def test_a_pruned_top_never_stands_in_above_its_bounds(cases: list[Case]) -> None:
    # a pruned failed step has no full rate: its stand-in is at most the held rate scaled to
    # its load, and at most any rate served in full at a load at or above it
    for c in cases:
        lo, hi = _bracket(c.cap)
        if lo is None or hi is None or hi.pruned is None or c.cap.capped:
            continue
        full_above = [s.rps for s in c.cap.steps if s.pruned is None and s.factor >= hi.factor]
        bound = min([lo.rps / lo.factor * hi.factor, *full_above])
        assert c.cap.high <= max(bound, lo.rps) + 1e-9, c.cap.steps


def test_the_answer_is_read_back_from_any_search_s_steps(cases: list[Case]) -> None:
    # what capacity.json keeps gives the live answer again (scripts/gpu/screen_again.py and
    # the re-derived records rely on it), whatever the start; a binding incumbent's answer is
    # capped by its rate, which the steps do not keep
    checked = 0
    for c in cases:
        if c.cap.capped or (c.start is not None and c.start.binding):
            continue
        again = from_steps(c.cap.steps)
        assert (again.low, again.high, again.censored) == (c.cap.low, c.cap.high, c.cap.censored)
        assert again.rps == pytest.approx(c.cap.rps, rel=1e-12), c.cap.steps
        checked += 1
    assert checked >= 1000
