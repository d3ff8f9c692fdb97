"""GPU memory, utilisation and power through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every function works without a driver: :func:`nvml_available` is False, :func:`gpu_memory`
returns ``[]``, :func:`wait_for_free_memory` and :func:`wait_for_used_memory` return
``(True, [])`` and :class:`GpuSampler` is a no-op. ``pynvml.NVMLError`` is translated here and
never escapes: :func:`gpu_memory` raises :class:`~tuner.errors.EngineError`, the sampler counts
errors.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from tuner.errors import EngineError

try:
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
    pynvml = None

__all__ = [
    "GpuMemory",
    "GpuSampler",
    "gpu_memory",
    "machine_of",
    "memory_info",
    "nvml_available",
    "wait_for_free_memory",
    "wait_for_used_memory",
]

log = logging.getLogger(__name__)

GIB = float(1 << 30)

_lock = threading.Lock()
_state: dict[str, Any] = {"checked": False, "ok": False, "error": None}


@dataclasses.dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as nvidia-smi shows it (:func:`memory_info`)."""

    index: int
    used_gib: float
    free_gib: float
    total_gib: float
    name: str = ""
    """NVML's device name, e.g. ``NVIDIA H200``."""
    uuid: str = ""
    """NVML's UUID of the card (``GPU-5f3c...``): which physical GPU, whatever the machine's
    name (every lent device machine is called ``vm``)."""


def nvml_available() -> bool:
    """Initialise NVML once per process; False when there is no library or driver."""
    with _lock:
        if not _state["checked"]:
            _state["checked"] = True
            if pynvml is None:
                _state["error"] = "pynvml is not installed"
            else:
                try:
                    pynvml.nvmlInit()
                    _state["ok"] = True
                except Exception as exc:  # NVMLError, or OSError from a broken library
                    _state["error"] = f"{type(exc).__name__}: {exc}"
                    log.debug("NVML unavailable: %s", _state["error"])
        return bool(_state["ok"])


def nvml_error() -> str | None:
    """Why NVML is unavailable (after :func:`nvml_available` returned False)."""
    error = _state["error"]
    return None if error is None else str(error)


def _reset() -> None:
    """Forget the cached NVML state (tests)."""
    with _lock:
        _state.update(checked=False, ok=False, error=None)


def memory_info(handle: Any) -> Any:
    """NVML's memory figures of a device as nvidia-smi shows them: ``nvmlDeviceGetMemoryInfo_v2``,
    whose ``used`` leaves out what the driver reserves (the v1 ``used`` counts it: 0.60 GiB on an
    idle H200 where nvidia-smi said 0 MiB); v1 where the driver lacks v2. ``free`` and ``total``
    are the same in both."""
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except Exception:  # NVMLError (no v2 in this driver), or a pynvml without the version
        return pynvml.nvmlDeviceGetMemoryInfo(handle)


def _memory(index: int) -> GpuMemory:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    mem = memory_info(handle)
    try:
        name = pynvml.nvmlDeviceGetName(handle)
    except Exception:  # NVMLError: the name is only shown
        name = ""
    name = name.decode() if isinstance(name, bytes) else str(name)
    try:
        uuid = pynvml.nvmlDeviceGetUUID(handle)
    except Exception:  # NVMLError: the UUID only tells machines apart
        uuid = ""
    uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    return GpuMemory(index, mem.used / GIB, mem.free / GIB, mem.total / GIB, name, uuid)


def machine_of(readings: Sequence[GpuMemory]) -> str | None:
    """The cards of ``readings`` as one key (their UUIDs, comma-joined): the same key means the
    same GPUs, whichever process or run measured them; None without UUIDs (no NVML)."""
    return ",".join(m.uuid for m in readings if m.uuid) or None


def gpu_memory(indices: Sequence[int]) -> list[GpuMemory]:
    """Used/free/total GiB of each GPU index (NVML order); ``[]`` without NVML.

    Raises :class:`EngineError` if NVML fails for an index (e.g. no such GPU).
    """
    if not nvml_available():
        return []
    try:
        return [_memory(i) for i in indices]
    except Exception as exc:  # pynvml.NVMLError and subclasses
        raise EngineError(f"NVML could not read GPU memory for {list(indices)}: {exc}") from exc


def wait_for_free_memory(
    indices: Sequence[int], need_gib: float, timeout_s: float, poll_s: float = 1.0
) -> tuple[bool, list[GpuMemory]]:
    """Poll until every GPU in ``indices`` has ``need_gib`` free, or ``timeout_s`` passes.

    Returns ``(met, last readings)``. Without NVML it returns ``(True, [])`` at once: the caller
    should log that it could not check. Raises :class:`EngineError` if NVML fails.
    """
    if not nvml_available():
        return True, []
    deadline = time.monotonic() + timeout_s
    while True:
        mem = gpu_memory(indices)
        if all(m.free_gib >= need_gib for m in mem):
            return True, mem
        if time.monotonic() >= deadline:
            return False, mem
        time.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))


def wait_for_used_memory(
    ceilings: Mapping[int, float], timeout_s: float, poll_s: float = 1.0
) -> tuple[bool, list[GpuMemory]]:
    """Poll until every GPU ``index`` in ``ceilings`` uses at most ``ceilings[index]`` GiB (a
    stopped server's memory released), or ``timeout_s`` passes. Returns ``(met, last readings)``;
    ``(True, [])`` without NVML. Raises :class:`EngineError` if NVML fails."""
    if not nvml_available():
        return True, []
    deadline = time.monotonic() + timeout_s
    while True:
        mem = gpu_memory(list(ceilings))
        if all(m.used_gib <= ceilings[m.index] for m in mem):
            return True, mem
        if time.monotonic() >= deadline:
            return False, mem
        time.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))


class GpuSampler:
    """Samples memory used, utilisation % and power W of each GPU every ``interval_s``.

    ``with GpuSampler([0], 0.5) as s: ...`` runs a daemon thread; ``s.samples`` holds one dict
    per GPU and tick: ``{"t_s", "gpu", "mem_used_gib", "util_pct", "power_w"}`` (a field NVML
    cannot read is absent). A no-op when NVML is unavailable. Errors are counted in ``errors``.
    """

    def __init__(self, indices: Sequence[int], interval_s: float = 1.0) -> None:
        self.indices = list(indices)
        self.interval_s = max(0.01, interval_s)
        self.samples: list[dict[str, float]] = []
        self.errors = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._handles: list[tuple[int, Any]] = []

    @property
    def active(self) -> bool:
        return self._thread is not None

    def start(self) -> GpuSampler:
        if self._thread is not None or not self.indices or not nvml_available():
            return self
        try:
            self._handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in self.indices]
        except Exception as exc:  # NVMLError: no such GPU, driver gone
            self._fail(exc)
            return self
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=max(5.0, 2 * self.interval_s))
        self._thread = None

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _fail(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"

    def sample_once(self) -> None:
        """Append one sample per GPU (called by the thread; public for tests)."""
        t = time.perf_counter() - self._t0
        for index, handle in self._handles:
            row: dict[str, float] = {"t_s": t, "gpu": float(index)}
            try:
                row["mem_used_gib"] = memory_info(handle).used / GIB
            except Exception as exc:
                self._fail(exc)
            try:
                row["util_pct"] = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except Exception as exc:
                self._fail(exc)
            try:
                row["power_w"] = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            except Exception as exc:
                self._fail(exc)
            self.samples.append(row)

    def _run(self) -> None:
        next_at = time.perf_counter()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # never let the thread die noisily
                self._fail(exc)
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.perf_counter()))

    def summary(self) -> dict[str, float]:
        """``gpu_mem_used_peak_gib`` (max over GPUs and time), ``gpu_util_mean`` (%),
        ``gpu_power_mean_w`` (mean per GPU); keys absent without samples."""
        out: dict[str, float] = {}
        mem = [s["mem_used_gib"] for s in self.samples if "mem_used_gib" in s]
        util = [s["util_pct"] for s in self.samples if "util_pct" in s]
        power = [s["power_w"] for s in self.samples if "power_w" in s]
        if mem:
            out["gpu_mem_used_peak_gib"] = max(mem)
        if util:
            out["gpu_util_mean"] = sum(util) / len(util)
        if power:
            out["gpu_power_mean_w"] = sum(power) / len(power)
        return out
