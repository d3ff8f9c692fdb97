"""Shared by the capacity tests: a chat workload on the simulator whose SLOs bind at a few
requests/s (short requests, a TPOT SLO of 10 ms the simulated H200 meets up to ~16 in flight),
so on 2 busy cores the replay client's own delay and the simulator's lag stay small against the
SLOs; and a scripted capacity probe for the search's unit tests.

Until 2026-12-02 the simulator ran at half speed against a 20 ms TPOT SLO: the same modelled
regime (the same loads in flight), twice as long in wall time. At full speed the capacity tests
take ~40 % less (test_capacity_study 104 s against 145-165 s, test_screen_study 66 s against
118-125 s) and one config's capacity repeated within 0.5 % on three fresh servers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tuner.capacity import Step

BINDING_SLOS = [
    "+workload=chat",
    "engine=sim",
    "objective=capacity",
    "workload.warmup_requests=1",
    "workload.arrival.concurrency=4",
    "workload.output_tokens.low=16",
    "workload.output_tokens.high=32",
    "workload.slo.tpot_ms=10",
    "workload.slo.ttft_ms=4000",
    "engine.env.TUNER_SIM_SPEEDUP=1",
]


def probe_of(
    margin_at: Callable[[float], float], rps_per_factor: float = 10.0
) -> tuple[Callable[[float], Awaitable[Step]], list[float]]:
    """A probe whose step at factor ``f`` serves ``rps_per_factor × f`` requests/s with the
    margin ``margin_at(f)``, and the factors it was asked for, in order."""
    tried: list[float] = []

    async def probe(f: float) -> Step:
        tried.append(f)
        m = margin_at(f)
        return Step(factor=f, rps=rps_per_factor * f, margin=m, held=m >= 0)

    return probe, tried
