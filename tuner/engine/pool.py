"""The GPU pool: parallel trials lease disjoint GPUs, as many as their server uses
(:func:`gpus_per_server`: tensor parallelism × data parallelism).

A lease is exclusive: no two servers ever share a GPU (asserted on every grant). Leases are
granted first come, first served; a trial that needs more GPUs than are free waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from tuner.config import TunerConfig
from tuner.errors import ConfigError

__all__ = [
    "GpuPool",
    "check",
    "core_ranges",
    "cpu_layout",
    "cpu_plan",
    "describe_cores",
    "gpus_per_server",
    "on_cores",
    "reserved_cores",
    "thread_ids",
]

log = logging.getLogger(__name__)


def gpus_per_server(params: Mapping[str, Any]) -> int:
    """The GPUs one ``vllm serve`` with these params uses: ``tensor_parallel_size`` ×
    ``data_parallel_size`` (each absent or None: vLLM's default, 1). Each of the DP engine
    replicas runs on its own TP GPUs (vLLM 0.24 gives DP rank ``i`` the visible devices
    ``[i × TP, (i + 1) × TP)``), so the lease, the capacity per GPU and the capacity card all count
    these. ``params``: the values the server runs with (``model.fixed_args`` included)."""
    tp = params.get("tensor_parallel_size")
    dp = params.get("data_parallel_size")
    return max(1, int(tp or 1)) * max(1, int(dp or 1))


class GpuPool:
    def __init__(self, gpus: Sequence[int]) -> None:
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"GPU list has duplicates: {list(gpus)}")
        self.gpus = list(gpus)
        self._free = list(gpus)
        self._held: set[int] = set()
        self._cond = asyncio.Condition()

    @property
    def size(self) -> int:
        return len(self.gpus)

    @property
    def held(self) -> int:
        """GPUs leased right now (by running trials)."""
        return len(self._held)

    @asynccontextmanager
    async def lease(self, n: int) -> AsyncIterator[list[int]]:
        """Hold ``n`` GPUs (lowest indices first) for the duration of the block."""
        if not 1 <= n <= self.size:
            raise ValueError(f"cannot lease {n} of {self.size} GPUs")
        async with self._cond:
            await self._cond.wait_for(lambda: len(self._free) >= n)
            granted = sorted(self._free)[:n]
            for g in granted:
                self._free.remove(g)
            assert not self._held & set(granted), "a GPU was leased twice"
            self._held |= set(granted)
        try:
            yield granted
        finally:
            async with self._cond:
                self._held -= set(granted)
                self._free += granted
                self._cond.notify_all()


def cpu_plan(gpus: Sequence[int], cpus: Sequence[int], reserve: int) -> dict[int, list[int]]:
    """Disjoint CPU cores for each GPU's server: the first ``reserve`` of ``cpus`` stay with the
    tuner (its replay client and telemetry), the rest are split evenly and in order over ``gpus``;
    a lease of several GPUs gets the union of theirs. Raises ValueError if a GPU would get none."""
    rest = sorted(cpus)[reserve:]
    if reserve < 0 or len(rest) < len(gpus):
        raise ValueError(
            f"{len(cpus)} CPU cores, {reserve} kept for the tuner: fewer than one per GPU "
            f"({len(gpus)})"
        )
    share, extra = divmod(len(rest), len(gpus))
    plan: dict[int, list[int]] = {}
    start = 0
    for i, g in enumerate(gpus):
        n = share + (1 if i < extra else 0)
        plan[g] = rest[start : start + n]
        start += n
    return plan


def reserved_cores(cpus: Sequence[int], reserve: int) -> list[int]:
    """The cores :func:`cpu_plan` keeps for the tuner: the first ``reserve`` of ``cpus``."""
    return sorted(cpus)[: max(0, reserve)]


def cpu_layout(gpus: Sequence[int], reserve: int) -> tuple[list[int], dict[int, list[int]]]:
    """``engine.cpu_pinning`` over this process's cores: the tuner's (:func:`reserved_cores`)
    and each GPU's server's (:func:`cpu_plan`, which raises ValueError if a GPU gets none)."""
    cpus = sorted(os.sched_getaffinity(0))
    return reserved_cores(cpus, reserve), cpu_plan(gpus, cpus, reserve)


def check(cfg: TunerConfig) -> None:
    """``engine.cpu_pinning``: :func:`cpu_layout` gives every GPU of ``engine.gpus`` cores of its
    own (else ConfigError, one line)."""
    if cfg.engine.cpu_pinning:
        try:
            cpu_layout(cfg.engine.gpus, cfg.engine.cpu_reserve)
        except ValueError as exc:
            raise ConfigError(
                f"engine.cpu_pinning: {exc}; lower engine.cpu_reserve or set cpu_pinning=false"
            ) from exc


def thread_ids(pid: int) -> list[int]:
    """The thread ids of process ``pid`` (Linux ``/proc``); none if it has ended or there is no
    ``/proc``."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit()]
    except OSError:
        return []


def _threads() -> list[int]:
    """This process's thread ids; ``[0]`` (the calling thread) without ``/proc``."""
    return thread_ids(os.getpid()) or [0]


@contextlib.contextmanager
def on_cores(cores: Sequence[int]) -> Iterator[list[int]]:
    """Run this process on ``cores`` inside the block: every thread it has now, and so every
    thread and process started from it later (client processes, the servers until they are
    pinned to their own cores). The previous cores come back after the block. Yields the cores
    now in use: ``cores``, or the old set if ``cores`` is empty or the kernel refused it
    (logged)."""
    before = sorted(os.sched_getaffinity(0))
    if not cores:
        yield before
        return
    moved: list[int] = []
    try:
        for tid in _threads():
            with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
                os.sched_setaffinity(tid, cores)
                moved.append(tid)
    except OSError as exc:
        log.warning("could not move the tuner to CPUs %s: %s; it stays unpinned", list(cores), exc)
        for tid in moved:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, before)
        yield before
        return
    try:
        yield sorted(cores)
    finally:
        for tid in _threads():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, before)


def core_ranges(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` → ``0-2,5``."""
    groups: list[list[int]] = []
    for c in cpus:
        if groups and groups[-1][1] == c - 1:
            groups[-1][1] = c
        else:
            groups.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in groups)


def describe_cores(own: Sequence[int], servers: dict[int, list[int]]) -> str:
    """``engine.cpu_pinning``'s layout in words: the tuner's cores (:func:`reserved_cores`) and
    each GPU's server's (:func:`cpu_plan`)."""
    tuner = "the tuner unpinned"
    if own:
        tuner = f"the tuner and its replay client on {core_ranges(own)}"
    per_gpu = ", ".join(f"GPU {g} on {core_ranges(c)}" for g, c in sorted(servers.items()))
    return f"{tuner}; servers: {per_gpu}"
