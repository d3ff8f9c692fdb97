"""Server and GPU telemetry collected while a replay runs."""

from tuner.telemetry.gpu import (
    GpuMemory,
    GpuSampler,
    gpu_memory,
    nvml_available,
    wait_for_free_memory,
)
from tuner.telemetry.prom import DEFAULT_NAMES, MetricsScraper, parse_metrics

__all__ = [
    "DEFAULT_NAMES",
    "GpuMemory",
    "GpuSampler",
    "MetricsScraper",
    "gpu_memory",
    "nvml_available",
    "parse_metrics",
    "wait_for_free_memory",
]
