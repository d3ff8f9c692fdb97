from __future__ import annotations

import asyncio

import pytest

from tuner.engine.pool import GpuPool


async def test_leases_are_disjoint_and_wait_for_enough_gpus() -> None:
    pool = GpuPool([0, 1, 2])
    order: list[str] = []

    async def hold(name: str, n: int, seconds: float) -> list[int]:
        async with pool.lease(n) as gpus:
            order.append(f"{name}+")
            await asyncio.sleep(seconds)
            order.append(f"{name}-")
            return gpus

    a = asyncio.create_task(hold("a", 2, 0.05))
    await asyncio.sleep(0)  # a takes GPUs 0 and 1
    b = asyncio.create_task(hold("b", 2, 0.01))  # must wait for a: only GPU 2 is free
    c = asyncio.create_task(hold("c", 1, 0.01))  # fits beside a
    ga, gb, gc = await asyncio.gather(a, b, c)
    assert ga == [0, 1] and gc == [2] and len(gb) == 2
    assert order.index("b+") > order.index("a-")
    assert order.index("c+") < order.index("a-")


def test_bad_leases() -> None:
    with pytest.raises(ValueError, match="duplicates"):
        GpuPool([0, 0])

    async def too_many() -> None:
        async with GpuPool([0]).lease(2):
            pass

    with pytest.raises(ValueError, match="cannot lease 2 of 1"):
        asyncio.run(too_many())


def test_cpu_plan_splits_the_cores_left_after_the_reserve() -> None:
    from tuner.engine.pool import cpu_plan

    assert cpu_plan([0, 1], list(range(16)), 2) == {0: list(range(2, 9)), 1: list(range(9, 16))}
    assert cpu_plan([3, 5], [0, 1, 2, 3, 4, 5, 6], 2) == {3: [2, 3, 4], 5: [5, 6]}
    plan = cpu_plan([0, 1, 2, 3], list(range(64)), 4)
    cores = [c for cs in plan.values() for c in cs]
    assert len(cores) == len(set(cores)) == 60 and min(cores) == 4  # disjoint, reserve kept
    with pytest.raises(ValueError, match="fewer than one per GPU"):
        cpu_plan([0, 1], [0, 1], 1)
