"""``workload``: the requests a replay sends (lengths, images, a trace), when it sends them
(``arrival``), the client that sends them, and the per-request SLOs."""

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

__all__ = [
    "ArrivalConfig",
    "DistConfig",
    "ImageConfig",
    "SLOConfig",
    "TraceConfig",
    "WorkloadConfig",
]


@dataclass
class DistConfig:
    """A token-length distribution: ``fixed`` (mean), ``uniform`` (low..high), ``normal`` and
    ``lognormal`` (mean, std), always clipped to [low, high]."""

    kind: str = "fixed"
    mean: float = 128.0
    std: float = 0.0
    low: int = 1
    high: int = 1_000_000


@dataclass
class ImageConfig:
    """Synthetic images per request: a count in [min_count, max_count], sizes drawn from buckets."""

    min_count: int = 1
    max_count: int = 4
    sizes: list[list[int]] = field(default_factory=lambda: [[512, 512], [1024, 768]])
    formats: list[str] = field(default_factory=lambda: ["jpeg", "png"])
    max_pixels: int = 16384 * 16384
    """Largest image (width x height) a bucket may have when the model directory has no
    ``preprocessor_config.json`` saying its own limit (``max_pixels``, ``size.longest_edge``)."""


@dataclass
class ArrivalConfig:
    """``concurrency`` (closed loop), ``poisson``/``gamma``/``constant`` at ``rate``, or ``ramp``
    (the rate rises or falls linearly in time from ``ramp_start_rate`` to ``ramp_end_rate`` over
    the measured requests; gaps gamma-distributed with ``burstiness``, 1 = Poisson)."""

    kind: str = "concurrency"
    concurrency: int = 32
    rate: float = 10.0
    burstiness: float = 1.0
    max_concurrency: int | None = None
    """Open loop (and trace replay): at most this many requests in flight; later arrivals wait."""
    ramp_start_rate: float | None = None
    """``ramp``: requests/s at the first measured request (>= 0)."""
    ramp_end_rate: float | None = None
    """``ramp``: requests/s at the last measured request (> 0)."""


@dataclass
class TraceConfig:
    """A request trace to replay (``workload.trace``): one row per request with its arrival
    timestamp, input and output token counts. The defaults read GuideLLM's CSV layout
    (``timestamp,input_length,output_length``, seconds); the Azure LLM inference trace is
    ``{timestamp: TIMESTAMP, input_tokens: ContextTokens, output_tokens: GeneratedTokens,
    timestamp_format: datetime}``."""

    path: str = MISSING
    format: str = "auto"
    """``csv``, ``jsonl`` or ``auto`` (from the file suffix: ``.csv``; ``.jsonl``/``.json``)."""
    timestamp: str = "timestamp"
    """Column (CSV header) or key (JSONL) of the arrival time."""
    input_tokens: str = "input_length"
    output_tokens: str = "output_length"
    timestamp_format: str = "seconds"
    """``seconds`` (a number) or ``datetime`` (ISO-like ``2023-11-16 18:15:46.6805900``)."""
    time_scale: float = 1.0
    """Multiplies every inter-arrival time: 0.5 replays twice as fast, 2 half as fast."""
    limit: int | None = None
    """Replay only the first N rows (after ``offset_s``)."""
    offset_s: float = 0.0
    """Skip the rows in the first ``offset_s`` seconds of the trace (trace time, unscaled)."""


@dataclass
class SLOConfig:
    """Per-request service levels; a request meets them only if it meets all that are set."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


@dataclass
class WorkloadConfig:
    name: str = MISSING
    endpoint: str = "chat"
    num_requests: int = 200
    duration_s: float = 300.0
    """Upper bound on the replay's wall time; unsent requests are not counted."""
    warmup_requests: int = 0
    request_timeout_s: float = 300.0
    client_processes: Any = "auto"
    """Replay client processes (``tuner.replay_procs``): the requests in flight are split over
    them; 1 replays in the tuner's own process. ``auto`` (the default) chooses per replay, from
    its requests in flight (``tuner.replay.choose_client``): at most ``STREAMS_PER_PROCESS`` (16)
    streams per process, up to ``IN_PROCESS_STREAMS`` (8) in the tuner's own, within the cores
    the client may use (on 2 cores: the tuner's own). An integer >= 1 fixes the count, never
    more than the cores usable (nor, when it runs, the requests in flight). One process adds tens
    of ms at p99 at 1,000 streams (20,000 chunks/s at a 50 ms engine step); 24 kept it under 1 ms
    on the H200 host (docs/replay-accuracy.md)."""
    client_loop: str = "asyncio"
    """The event loop of the replay client (and of the tuner's process, which runs it when it
    takes one process): ``asyncio`` (the standard library's) or ``uvloop`` (libuv's,
    ``pip install 'tuner[fast]'``; less CPU per chunk)."""
    seed: int = 0
    stratify: bool = True
    """Draw the lengths, images per request and image sizes stratified in blocks of 16
    (:mod:`tuner.workload.lengths`): any few hundred requests carry the distributions' means, so
    a capacity does not depend on the seed. ``false``: independent draws, the streams of every
    run before 2026-12-05 (the simulator's calibration replays those)."""
    system_prompt_tokens: int = 0
    """A system prompt shared by every request (so prefix caching matters)."""
    turns: int = 1
    """Turns per conversation; later turns carry the earlier ones as context."""
    input_tokens: DistConfig = field(default_factory=DistConfig)
    output_tokens: DistConfig = field(default_factory=DistConfig)
    images: ImageConfig | None = None
    arrival: ArrivalConfig = field(default_factory=ArrivalConfig)
    """Ignored for a trace except ``max_concurrency``: the trace gives the send times."""
    trace: TraceConfig | None = None
    """Replay a trace file: its rows give the measured requests (``num_requests`` and the
    length distributions are ignored) and their send times; warm-ups take the first rows'
    lengths."""
    slo: SLOConfig = field(default_factory=SLOConfig)
    server_args: dict[str, Any] = field(default_factory=dict)
    """Flags this workload needs on every launch (e.g. ``limit-mm-per-prompt``)."""
    corpus: str = "${paths.root_dir}/workloads/corpus.txt.gz"
