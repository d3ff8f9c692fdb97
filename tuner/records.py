"""Frozen, JSON-serialisable records that flow between the pipeline stages.

Every artifact the tuner writes (``requests.jsonl``, ``result.json``, ...) is one of these, dumped
with :func:`to_json`. Times are seconds (``*_s``) unless a name says otherwise.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

__all__ = [
    "Candidate",
    "ConfirmResult",
    "LaunchInfo",
    "LogFacts",
    "StartupFacts",
    "RequestRecord",
    "RequestSpec",
    "TrialResult",
    "rejected_before_launch",
    "to_json",
    "to_jsonable",
]

RequestStatus = Literal["ok", "error", "timeout"]


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, enums, tuples and mappings to plain JSON types (recursively). A dataclass
    field with ``metadata={"inline": True}`` is written as its own fields, in its place; one with
    ``metadata={"omit_none": True}`` is left out while it is None (a field added later: the
    records written before it keep their text)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            raw = getattr(obj, f.name)
            if raw is None and f.metadata.get("omit_none"):
                continue
            value = to_jsonable(raw)
            if f.metadata.get("inline"):
                out.update(value)
            else:
                out[f.name] = value
        return out
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "value") and hasattr(obj, "name") and type(obj).__module__ != "builtins":
        return obj.value  # enums
    return obj


def to_json(obj: Any, **kwargs: Any) -> str:
    return json.dumps(to_jsonable(obj), **kwargs)


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    """One request to send: built by :mod:`tuner.workload`, sent by :mod:`tuner.replay`.

    ``body`` is the OpenAI request body without ``model`` and ``stream`` (the replay adds them).
    ``arrival_s`` is the scheduled send time relative to the replay start for open-loop arrivals,
    ``None`` for closed-loop. ``warmup`` requests are sent first and excluded from the metrics.
    """

    index: int
    endpoint: Literal["chat", "completions"]
    body: dict[str, Any]
    prompt_tokens: int
    output_tokens: int
    arrival_s: float | None = None
    warmup: bool = False
    images: int = 0


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """What happened to one request. A failed request is a status, never an exception."""

    index: int
    status: RequestStatus
    t_sent_s: float
    """Send time relative to the replay start."""
    ttft_s: float | None = None
    itl_s: tuple[float, ...] = ()
    """Gaps between consecutive content chunks (one sample per chunk, as ``vllm bench serve``)."""
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    http_status: int | None = None
    error: str | None = None
    warmup: bool = False

    @property
    def tpot_s(self) -> float | None:
        """(e2e - ttft) / (output_tokens - 1), as ``vllm bench serve`` defines TPOT."""
        if (
            self.e2e_s is None
            or self.ttft_s is None
            or self.output_tokens is None
            or self.output_tokens < 2
        ):
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclasses.dataclass(frozen=True)
class LogFacts:
    """What a server's start-up log says (:func:`tuner.engine.logparse.parse_facts`); None where
    it says nothing."""

    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_model_len: int | None = None
    kv_cache_gib: float | None = None
    model_load_gib: float | None = None
    model_load_s: float | None = None
    graph_capture_s: float | None = None
    graph_capture_gib: float | None = None
    init_engine_s: float | None = None
    compile_s: float | None = None
    engine_version: str | None = None


@dataclasses.dataclass(frozen=True)
class StartupFacts:
    """Where a launch's start-up time went and what the compile cache did
    (:func:`tuner.engine.startup_log.startup_facts`).

    ``phases``: seconds per phase, in start-up order (``tuner.engine.startup_log.PHASES``), each
    from the previous mark to its own: the launch, the log's first line, EngineCore's first
    line, model loaded, torch.compile done, KV cache allocated, CUDA graphs captured, engine
    init done, /health ready. A phase whose mark the log lacks is absent (its time counts in the
    next one). ``compile_cache``: ``hit`` (the compiled artifact was loaded), ``miss`` (it was
    compiled), None (no torch.compile, e.g. ``--enforce-eager``). ``compile_hash``: vLLM's own
    cache key (the folder under ``torch_compile_cache/``), ``aot_hash`` its AOT artifact's."""

    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    compile_cache: str | None = None
    compile_hash: str | None = None
    aot_hash: str | None = None


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """What the launcher learned while starting a server: its port, pid and start-up time, and
    what its log said (``facts``; its ``engine_version`` is the server's ``/version`` answer when
    there is one). Serialised flat: ``facts``' fields follow ``startup_s``, then ``startup``
    (absent from records written before it existed), then ``preloaded`` (True: forked from a
    zygote, ``engine.preload``; absent for a server started as a process)."""

    port: int
    pid: int
    startup_s: float
    facts: LogFacts = dataclasses.field(default_factory=LogFacts, metadata={"inline": True})
    startup: StartupFacts | None = dataclasses.field(default=None, metadata={"omit_none": True})
    preloaded: bool | None = dataclasses.field(default=None, metadata={"omit_none": True})


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """The outcome of one trial: what Optuna is told and MLflow records."""

    number: int
    params: dict[str, Any]
    argv: tuple[str, ...]
    values: tuple[float, ...] | None
    """Objective values in the order of the objective config; ``None`` if the trial failed."""
    constraints: dict[str, float]
    """Named Optuna constraints; > 0 means violated (:func:`tuner.score.constraints`)."""
    metrics: dict[str, float]
    failure_reason: str | None = None
    failure_detail: str | None = None
    launch: LaunchInfo | None = None
    predicted_kv_tokens: int | None = None
    baseline: bool = False
    duration_s: float = 0.0
    launched: bool = False
    """False when the precheck rejected the params (no server was started)."""
    server_s: float = 0.0
    """Seconds a server held the GPUs (launch to teardown): the trial's GPU cost."""
    pruned: str | None = None
    """Why the replay was stopped early (the trial is PRUNED), or None."""
    gpus: tuple[int, ...] = ()
    """The GPUs the trial leased (``CUDA_VISIBLE_DEVICES``); empty if it was not launched."""
    started_at: float = 0.0
    """Wall-clock (epoch) seconds when the trial started; ``duration_s`` later it ended."""
    machine: str | None = None
    """The leased GPUs' NVML UUIDs, comma-joined: which cards measured it (the lever screen
    compares servers of one machine, :func:`tuner.verdict.gain_in_blocks`); None without NVML
    (the simulator)."""

    @property
    def ok(self) -> bool:
        return self.failure_reason is None

    @property
    def rejected_before_launch(self) -> bool:
        """:func:`rejected_before_launch` of this result."""
        return rejected_before_launch(self.failure_reason, self.launched, self.gpus)


def rejected_before_launch(
    failure_reason: str | None, launched: bool | None, gpus: Sequence[int] | None
) -> bool:
    """The precheck (or a lease limit) refused the params before any GPU was leased: it failed,
    was not launched (False: None is a trial that never said, e.g. interrupted) and leased no
    GPU, so no GPU time was spent on it. The one rule for a :class:`TrialResult` and a stored
    trial (:func:`tuner.stored_trial.rejected_before_launch`)."""
    return failure_reason is not None and launched is False and not gpus


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A trial chosen for the confirm stage, under every pick name that chose it."""

    trial: int
    picks: tuple[str, ...]
    params: dict[str, Any]
    baseline: bool
    serve_args: tuple[str, ...]
    search_metrics: dict[str, float]


@dataclasses.dataclass(frozen=True)
class ConfirmResult:
    """The stress runs of one candidate, over every round: the worst case over them and whether it
    held (``passed``: in every round)."""

    trial: int
    picks: tuple[str, ...]
    params: dict[str, Any]
    passed: bool
    reason: str | None
    """Why the candidate was demoted (failed, errors, SLO missed under stress), or None."""
    worst: dict[str, float]
    search: dict[str, float]
    runs: tuple[dict[str, Any], ...] = dataclasses.field(default_factory=tuple)
    """One row per run: ``round`` (absent in verdicts stored before rounds: 1), ``seed``, ``ok``,
    ``failure_reason``, ``violated`` and the metrics (:data:`~tuner.score.KEY_METRICS` and the
    objectives)."""
    quality: dict[str, Any] | None = None
    """The quality guard's record for a candidate whose flags change numerics
    (:mod:`tuner.quality_guard`: ``status``, ``changes``, the worst round's ``agreement``,
    ``passed``, every round's comparison); None for one that changes none."""
