"""The GPU memory a real server needs before its launch and gives back after its stop.

:func:`wait_free_memory` waits (bounded) before a launch until the leased GPUs have the memory
vLLM's start-up check will demand, and :func:`gpu_freed` waits after the server stopped until
they are back near their readings from before the launch. Both read NVML
(:mod:`tuner.telemetry.gpu`) and do nothing for the simulator.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from tuner.config import EngineConfig
from tuner.engine.container import ContainerServer
from tuner.engine.process import Server
from tuner.errors import EngineError, FailureReason, LaunchFailed
from tuner.memory import VLLM_DEFAULTS
from tuner.telemetry.gpu import (
    GpuMemory,
    gpu_memory,
    nvml_available,
    wait_for_free_memory,
    wait_for_used_memory,
)

__all__ = ["GPU_FREED_SLACK_GIB", "gpu_freed", "wait_free_memory"]

log = logging.getLogger("tuner")

GPU_FREED_SLACK_GIB = 1.0
"""After a real server stopped, each of its GPUs counts as released once it uses at most this
much more than before the launch (a CUDA context is about 0.5 GiB; a server holds tens)."""


async def wait_free_memory(
    engine: EngineConfig, params: Mapping[str, Any], gpus: list[int]
) -> tuple[dict[str, float], list[GpuMemory]]:
    """Before a real launch: wait (bounded) for the memory vLLM's start-up check will demand;
    the metric ``gpu_used_before_launch_gib`` and the readings (none for the simulator)."""
    if engine.kind != "vllm" or not nvml_available():
        return {}, []
    gmu = float(params.get("gpu_memory_utilization") or VLLM_DEFAULTS["gpu_memory_utilization"])
    try:
        before = gpu_memory(gpus)
        need = max(m.total_gib for m in before) * gmu + 0.5 if before else 0.0
        ok, mem = await asyncio.to_thread(
            wait_for_free_memory, gpus, need, engine.gpu_free_timeout_s
        )
    except EngineError as exc:
        log.warning("cannot read GPU memory before launch (%s); launching anyway", exc)
        return {}, []
    used = max((m.used_gib for m in mem), default=0.0)
    if not ok:
        raise LaunchFailed(
            FailureReason.GPU_BUSY,
            f"GPU memory not free after {engine.gpu_free_timeout_s:.0f} s: "
            f"{used:.1f} GiB used, need {need:.1f} GiB free for gpu_memory_utilization {gmu}",
        )
    log.info("GPUs %s: %.2f GiB used before launch", gpus, used)
    return {"gpu_used_before_launch_gib": used}, mem


async def gpu_freed(
    engine: EngineConfig, before: list[GpuMemory], server: Server | None
) -> dict[str, float]:
    """After a real server stopped (process or container): wait, ``engine.gpu_free_timeout_s``
    at most, until each GPU of ``before`` (its readings before the launch) uses no more than it
    did then plus :data:`GPU_FREED_SLACK_GIB`; else a warning naming the container (or the
    server's process). Never fails the trial. The metric ``gpu_used_after_stop_gib``: the most
    any of them used at the end. Nothing (no NVML call) for the simulator or without readings."""
    if engine.kind != "vllm" or not before or server is None or server.proc is None:
        return {}
    ceilings = {m.index: m.used_gib + GPU_FREED_SLACK_GIB for m in before}
    timeout = engine.gpu_free_timeout_s
    if isinstance(server, ContainerServer) and server.removed is False:
        timeout = 0.0  # the container is still there: its memory will not come back
    t0 = time.monotonic()
    try:
        ok, mem = await asyncio.to_thread(wait_for_used_memory, ceilings, timeout)
    except EngineError as exc:
        log.warning("cannot read GPU memory after the server stopped: %s", exc)
        return {}
    if not mem:
        return {}
    used = max(m.used_gib for m in mem)
    if not ok:
        if isinstance(server, ContainerServer) and server.container_id:
            who = f"container {server.container_id[:12]}"
        else:
            who = f"server pid {server.proc.pid}"
        log.warning(
            "GPUs %s: %.1f GiB still used %.0f s after %s stopped (%.1f GiB before its launch); "
            "a later launch on them may find too little free memory",
            sorted(ceilings),
            used,
            time.monotonic() - t0,
            who,
            max(m.used_gib for m in before),
        )
    return {"gpu_used_after_stop_gib": used}
