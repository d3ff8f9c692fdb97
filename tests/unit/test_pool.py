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


def test_reserved_cores_are_the_ones_cpu_plan_leaves_out() -> None:
    from tuner.engine.pool import cpu_plan, reserved_cores

    cpus = [7, 1, 3, 5, 2, 4]
    own = reserved_cores(cpus, 2)
    assert own == [1, 2]
    plan = cpu_plan([0, 1], cpus, 2)
    assert set(own).isdisjoint(c for cs in plan.values() for c in cs)
    assert sorted(own + [c for cs in plan.values() for c in cs]) == sorted(cpus)
    assert reserved_cores(cpus, 0) == [] and reserved_cores(cpus, -1) == []


def _affinity_of_child() -> set[int]:
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, json; print(json.dumps(sorted(os.sched_getaffinity(0))))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(json.loads(out))


@pytest.mark.skipif(
    not hasattr(__import__("os"), "sched_setaffinity")
    or len(__import__("os").sched_getaffinity(0)) < 2,
    reason="needs Linux CPU affinity and 2 cores",
)
def test_on_cores_moves_every_thread_and_new_processes_then_restores() -> None:
    import os
    import threading

    from tuner.engine.pool import on_cores

    before = os.sched_getaffinity(0)
    one = min(before)
    started = threading.Event()
    stop = threading.Event()
    tid: list[int] = []

    def idle() -> None:  # a thread that exists before the block (as MLflow's would)
        tid.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    t = threading.Thread(target=idle)
    t.start()
    started.wait(5)
    try:
        with on_cores([one]) as cores:
            assert cores == [one]
            assert os.sched_getaffinity(0) == {one}
            assert os.sched_getaffinity(tid[0]) == {one}  # the older thread moved too
            seen: list[set[int]] = []
            inner = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
            inner.start()
            inner.join()
            assert seen == [{one}]
            assert _affinity_of_child() == {one}  # a process started now inherits the cores
        assert os.sched_getaffinity(0) == before
        assert os.sched_getaffinity(tid[0]) == before
        with on_cores([]) as cores:  # nothing reserved: left as it was
            assert set(cores) == before and os.sched_getaffinity(0) == before
        with on_cores([10_000]) as cores:  # a core the kernel refuses: stays unpinned
            assert set(cores) == before and os.sched_getaffinity(0) == before
        assert os.sched_getaffinity(tid[0]) == before
    finally:
        stop.set()
        t.join()
