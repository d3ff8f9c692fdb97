"""One exception hierarchy for the tuner, and the classification of failed trials.

::

    TunerError                       anything the tuner raises on purpose
    ├── ConfigError                  bad user input; caught at the entry point, printed as one line
    ├── TrialFailed(reason, detail)  a trial that could not be measured: recorded as data, never
    │   │                            fatal to the study; the precheck raises it as is (a config
    │   │                            refused before launch)
    │   ├── LaunchFailed             the server did not start or never became ready
    │   └── ReplayFailed             the server was ready, but the measurement broke (the engine
    │                                died, or every request failed)
    ├── EngineError                  the tuner cannot drive the engine (missing binary, NVML, ...)
    ├── StorageError                 a place the tuner keeps results cannot be reached or written
    │                                (the Optuna storage, the MLflow store, the run folder)
    └── ReplayClientError            a replay client process failed (the tuner's own failure)

Lower-level errors (aiohttp, NVML, subprocess) are translated at one boundary each with
``raise ... from exc``. Failed *requests* are not exceptions: they are a status on a record.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

__all__ = [
    "INTERRUPTED",
    "MACHINE_FAILURES",
    "ConfigError",
    "EngineError",
    "FailureReason",
    "LaunchFailed",
    "ReplayClientError",
    "ReplayFailed",
    "StorageError",
    "TrialFailed",
    "TunerError",
    "machine_may_have_failed",
]


class FailureReason(enum.StrEnum):
    """Why a trial produced no measurement. Values are stable: Optuna and MLflow store them."""

    INVALID_CONFIG = "invalid_config"
    """The engine rejected its arguments (argparse, pydantic, validation errors)."""
    KV_TOO_SMALL = "kv_too_small"
    """The KV cache cannot hold one ``max_model_len`` request."""
    NO_KV_MEMORY = "no_kv_memory"
    """Nothing left for KV cache blocks after weights and activations."""
    CUDA_OOM = "cuda_oom"
    """CUDA out of memory while loading, profiling, capturing graphs or warming up."""
    GPU_BUSY = "gpu_busy"
    """Free GPU memory below ``gpu_memory_utilization`` x total (another process holds the GPU)."""
    ENGINE_DEAD = "engine_dead"
    """The engine died after it became ready."""
    STARTUP_TIMEOUT = "startup_timeout"
    """The server did not answer ``/health`` in time."""
    CRASH = "crash"
    """The server exited without a message we recognise."""
    PRECHECK = "precheck"
    """Rejected by the tuner before launch (e.g. TP does not divide the heads)."""
    REPLAY_ERRORS = "replay_errors"
    """The server was up but too many requests failed."""


MACHINE_FAILURES = frozenset(
    {FailureReason.CRASH, FailureReason.GPU_BUSY, FailureReason.STARTUP_TIMEOUT}
)
"""Failures of a server that never became ready which may be the machine's rather than the
config's: an exit without a known message (on the H200 on 2026-12-03 every ``--quantization fp8``
server died at start with "No module named 'compressed_tensors'", the stage lacked it), another
process on the GPU, a slow start. A stored confirm server or verdict that failed so is run again
by the next run of the same command (:mod:`tuner.stored_study`); a crash after ready is
``ENGINE_DEAD``."""


def machine_may_have_failed(reasons: Iterable[str | None]) -> bool:
    """Whether any of a server's ``failure_reason``s is in :data:`MACHINE_FAILURES`."""
    return any(r in MACHINE_FAILURES for r in reasons)


INTERRUPTED = "interrupted"
"""The ``failure_reason`` of a trial that did not end because its tuner was stopped (Ctrl-C,
SIGTERM, or ``kill -9`` found by the next run's recovery). Such a trial is FAIL, not COMPLETE, so
this is no :class:`FailureReason`: those name the ``failed_<reason>`` constraints of measured
failures."""


class TunerError(Exception):
    """Base of every error the tuner raises on purpose."""


class ConfigError(TunerError):
    """Bad user input. The message is one line naming what is wrong and what is allowed."""


class EngineError(TunerError):
    """The tuner could not drive the engine at all (e.g. the command does not exist)."""


class StorageError(TunerError):
    """The Optuna storage, the MLflow tracking store or the run folder cannot be reached or
    written (a database down, a tracking server that does not answer, a read-only directory).
    The message is one line, its URL shown without a password."""


class ReplayClientError(TunerError):
    """A client process of a multi-process replay (``replay(processes=P)``) failed or died. It
    says nothing about the config under test, so it is not a :class:`TrialFailed`."""


class TrialFailed(TunerError):
    """A trial could not be measured; recorded with ``reason``, never raised out of the study.
    The precheck raises it as is (refused before launch); the subclasses say at which stage."""

    def __init__(self, reason: FailureReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


class LaunchFailed(TrialFailed):
    """The server did not start or never became ready: its GPUs' memory did not come free before
    launch, or (:meth:`tuner.engine.Server.start`) a fatal start-up line, an exit, or no
    ``/health`` answer in time."""


class ReplayFailed(TrialFailed):
    """The server became ready, but the measurement broke: the engine died during a replay
    (:meth:`tuner.engine.Server.check`), or every request of a replay failed."""
