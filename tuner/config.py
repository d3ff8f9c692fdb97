"""Typed configuration: Hydra structured-config schemas, converted once at the entry point.

The schemas are registered in Hydra's ConfigStore as ``tuner_schema`` (the primary config's first
default), so an unknown key or a wrong type fails when Hydra composes the config.
:func:`tuner.checks.to_config` turns the composed ``DictConfig`` into these dataclasses
(:func:`convert`) and checks what types cannot (ranges, choices): the checks below, and each
stage's own; nothing below the entry point sees a ``DictConfig``. This module imports no stage.
"""

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from tuner.errors import ConfigError

__all__ = [
    "ArrivalConfig",
    "ConfirmConfig",
    "ContainerConfig",
    "DistConfig",
    "EngineConfig",
    "ImageConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "ObjectiveSpec",
    "ParamSpec",
    "PathsConfig",
    "PrescreenConfig",
    "SLOConfig",
    "SpaceConfig",
    "StudyConfig",
    "TraceConfig",
    "TrackingConfig",
    "TunerConfig",
    "WorkloadConfig",
    "check_confirm",
    "check_engine",
    "check_images",
    "check_model",
    "check_model_path",
    "check_override_keys",
    "check_study",
    "check_workload",
    "compose_config",
    "convert",
    "unknown_key",
    "one_of",
    "register_schemas",
]


@dataclass
class ContainerConfig:
    """``engine.container``: each server runs as ``docker run ... <image>``, stopped and removed
    by its container id (tuner.engine.container). ``engine.command`` is the command run inside
    the image (its first word becomes ``--entrypoint``)."""

    image: str = "vllm/vllm-openai:v0.24.0"
    """Must be on the machine already (``docker pull`` it): trials never pull."""
    program: str = "docker"
    """The container CLI (checked on ``PATH`` before the study)."""
    mounts: list[str] = field(default_factory=list)
    """More ``-v`` specs (``src:dst[:ro]``); the model dir, the compile cache and the HF cache
    are mounted at their own paths already."""
    args: list[str] = field(default_factory=list)
    """More ``docker run`` options, put before the image."""


@dataclass
class EngineConfig:
    """How a server is started. ``kind`` is ``sim`` (the simulated engine) or ``vllm``; with
    ``container`` set (``engine=docker``) the server runs in a container."""

    kind: str = "sim"
    command: list[str] = field(default_factory=lambda: ["python", "-m", "tuner.sim", "serve"])
    """argv prefix; the model path and flags follow. A leading ``python`` means this interpreter."""
    host: str = "127.0.0.1"
    startup_timeout_s: float = 900.0
    stop_timeout_s: float = 15.0
    health_interval_s: float = 0.5
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the server process (values starting with ``$`` are read from ours)."""
    pass_env: list[str] = field(default_factory=lambda: ["HF_TOKEN", "VLLM_API_KEY"])
    """Variables passed through from our environment if set; their values are masked everywhere."""
    gpus: list[int] = field(default_factory=lambda: [0])
    """The GPU lease: indices that become ``CUDA_VISIBLE_DEVICES``."""
    cache_root: str | None = None
    """``VLLM_CACHE_ROOT``, the compile cache every launch shares: unset → one per user
    (``<user cache dir>/tuner/vllm``) for ``kind=vllm``, none for the simulator; ``user``,
    ``state`` (``<paths.state_dir>/vllm_cache``), ``none`` (vLLM's default), or a path."""
    pin_capture_size: bool = False
    """Add ``-cc.max_cudagraph_capture_size=512`` (vLLM's cap) to every launch that sets no capture
    size, so ``max_num_seqs`` < 256 no longer changes the compile key. Off: it may change which
    batch sizes run in CUDA graphs (not measured yet)."""
    gpu_free_timeout_s: float = 120.0
    """Before a launch, wait at most this long for NVML to show the memory the trial needs."""
    extra_args: list[str] = field(default_factory=list)
    """Flags added to every launch, after the model's fixed flags."""
    gpu: str = "h200"
    """GPU profile for the memory model's KV prediction (tuner.memory.GPU_PROFILES) where NVML
    cannot say (no driver here) and for the simulator; with ``kind: vllm`` and NVML, the leased
    GPUs' own memory is used (:func:`tuner.precheck.gpu_profile`)."""
    cpu_pinning: bool = False
    """Pin each server's process tree to CPU cores of its own (a fixed share per GPU of
    ``engine.gpus``), so parallel trials (``study.n_workers`` > 1) do not compete for cores, and
    the tuner (its replay client processes, telemetry) to the ``cpu_reserve`` cores left out."""
    cpu_reserve: int = 2
    """With ``cpu_pinning``: the first this many cores run the tuner and its replay client (0:
    the tuner stays unpinned). ``workload.client_processes=auto`` takes at most this many client
    processes; give it one per 32 requests in flight (8 at 256, ``tuner.replay.client_cores``)."""
    container: ContainerConfig | None = None
    """Run each server in a container (``engine=docker``); None: a process on this machine."""


@dataclass
class ModelConfig:
    """The model under test. ``path`` is a local directory with ``config.json`` and a tokenizer,
    or a Hugging Face repo id (``Qwen/Qwen3-8B``) whose config and tokenizer files come from the
    Hugging Face cache (:mod:`tuner.model_source`). The server gets ``path`` as it is and loads
    the weights itself (vLLM downloads a repo id's)."""

    name: str | None = None
    """Default (null): the last component of ``path`` (the repo's name), lower-cased."""
    path: str = MISSING
    served_name: str = "m"
    max_model_len: int | None = None
    """The model's own context length (vLLM's derived max_model_len). Default (null): derived
    from ``config.json`` (``text_config``'s for a vision-language model)."""
    load_format: str | None = None
    """``--load-format`` on every launch: ``dummy`` builds the model's shape with random weights
    (the shipped shapes under ``models/`` have none); null: vLLM's default, the real weights."""
    fixed_args: dict[str, Any] = field(default_factory=dict)
    """Flags passed on every launch, e.g. ``{enforce-eager: true}``."""
    local_dir: str | None = None
    """Set at load, not by hand: the local directory the tuner reads ``config.json``, the
    tokenizer and the chat template from (``path`` itself, or the repo's snapshot in the
    Hugging Face cache)."""

    @property
    def files(self) -> Path:
        """The local directory with the model's ``config.json`` and tokenizer files."""
        return Path(self.local_dir or self.path)


@dataclass
class ParamSpec:
    """One searched engine parameter; the name is the key in ``space.params``.

    ``type``: ``float``, ``int``, ``categorical`` or ``bool``. ``flag``: the ``vllm serve`` flag
    (default ``--`` + name with dashes); a flag containing ``.`` (e.g. ``-cc.cudagraph_mode``) is
    passed as ``flag=value``. ``default`` is vLLM's own default, used for the baseline trial.
    """

    type: str = MISSING
    flag: str | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: list[Any] | None = None
    default: Any = None
    enabled: bool = True
    grid: list[Any] | None = None
    """Values the ``grid`` sampler tries for a float/int parameter (categorical/bool use their
    choices; an int range of at most 64 values is enumerated)."""
    when: dict[str, Any] | None = None
    """Pass the flag only when the other params have these values (e.g. cudagraph_mode only
    when enforce_eager is false)."""


@dataclass
class SpaceConfig:
    params: dict[str, ParamSpec] = field(default_factory=dict)


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
    corpus: str = "${paths.root_dir}/workloads/corpus.txt"


@dataclass
class PrescreenConfig:
    """Search the simulator's landscape before the real trials (:mod:`tuner.prescreen`)."""

    trials: int = 0
    """Configs the prescreen evaluates on the simulator (0: off); 200 took 92 s (long_docs, 32 in
    flight) and 138 s (chat, 256 in flight) on a 2-core CPU."""
    top: int = 3
    """How many of its best configs (worse of two request streams) are enqueued."""


@dataclass
class StudyConfig:
    name: str | None = None
    """Default: ``<workload>-<model>-<engine kind>``, so the same command continues the same
    study, and the simulator's and vLLM's measurements never share one (a stored study records
    its engine kind; a run on another refuses to continue it, a named study too)."""
    n_trials: int = 12
    """Trials to run in this invocation (added to those already stored). A config the precheck
    rejects before launch costs no GPU time and does not count, up to ``max_rejected`` of them."""
    max_rejected: int = 50
    """Configs rejected before launch that do not count toward ``n_trials`` in one invocation;
    past this many, each further one counts (so a mostly infeasible space still ends)."""
    sampler: str = "tpe"
    seed: int = 0
    storage: str | None = None
    """Optuna storage URL; default SQLite under ``paths.state_dir``."""
    baseline_first: bool = True
    """Trial 0 of a new study runs vLLM's defaults (no searched flag passed)."""
    n_startup_trials: int = 4
    n_workers: int = 1
    """Trials run at once in this process, each on its own lease of ``engine.gpus`` (as many GPUs
    as its tensor parallelism); no two servers share a GPU."""
    warm_start: str | None = None
    """Name of a finished study in the same storage: its Pareto-best feasible configs are
    enqueued first (params this space does not search are dropped)."""
    precheck: bool = True
    """Reject before launch what vLLM's validation or the memory model says certainly fails
    (false: launch everything and let vLLM refuse; TP/lease limits are always checked)."""
    prescreen: PrescreenConfig = field(default_factory=PrescreenConfig)
    """Run once per study, before its first sampled trial: the simulator's best configs for this
    workload are enqueued (after the baseline and ``enqueue``) with their predicted metrics."""
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    """Configs to try before the sampler's own (e.g. your current flags): each entry names some
    params; the others take vLLM's defaults. An entry already tried is not enqueued again."""
    timeout_s: float | None = None
    """Wall-clock budget of this invocation's search, in seconds (Optuna's ``timeout``): once it
    has passed no new trial starts, running trials finish, and the confirm stage still runs. The
    study stops at ``n_trials`` or here, whichever comes first; the same command continues it."""
    repeats: int = 1
    """Replays per trial on its one server (repeat k replays the workload with seed
    ``workload.seed + k - 1``, another request order and content; caches reset in between). The
    trial's metrics, objectives and constraints are the mean over the repeats, and
    ``goodput_spread`` / ``output_throughput_spread`` ((max - min) / mean) say how much they
    varied. A replay costs far less than a vLLM start-up, and on the H200 goodput varied by about
    ±35 % between runs of one config (docs/results.md): repeats make the search compare configs,
    not noise. Pruned after the first repeat: the rest are skipped."""


@dataclass
class ObjectiveSpec:
    metric: str = MISSING
    direction: str = MISSING


@dataclass
class CapacityConfig:
    """The SLO-capacity search of each trial (:mod:`tuner.capacity`), when an objective is
    ``capacity_rps``: short replays at other loads on the trial's server."""

    rel_width: float = 0.05
    """Stop when the bracket (a load that held, the next one up that did not) is this narrow:
    (high - low) / low of their load factors."""
    max_steps: int = 8
    """Replays at most per server, the workload's own replay included."""
    min_factor: float = 0.015625
    """Lowest load tried, as a factor on the workload's load (1/64)."""
    max_factor: float = 64.0
    """Highest load tried; a config that holds there is recorded as ``capacity_censored``."""
    requests: int | None = None
    """Measured requests of each further replay (default: the workload's ``num_requests``)."""


@dataclass
class ObjectiveConfig:
    objectives: list[ObjectiveSpec] = field(
        default_factory=lambda: [
            ObjectiveSpec("output_throughput", "maximize"),
            ObjectiveSpec("ttft_p95_ms", "minimize"),
        ]
    )
    max_error_rate: float = 0.05
    """A trial whose failed-request share exceeds this violates a constraint."""
    slo_constraints: bool = True
    """Each SLO the workload sets (``workload.slo``) becomes a constraint on its percentile."""
    slo_percentile: int = 95
    """The percentile of TTFT/TPOT/E2E that must meet the SLO (50, 90, 95 or 99)."""
    prune: bool = True
    """Stop a replay once a constraint is lost beyond doubt (too many requests over an SLO or
    failed); the trial is PRUNED with its partial metrics."""
    capacity: CapacityConfig = field(default_factory=CapacityConfig)


@dataclass
class ConfirmConfig:
    """After the search: re-run the best configs longer and harder, then export them."""

    enabled: bool = True
    """false: skip the stress runs; the picks are still exported (marked unconfirmed)."""
    picks: list[str] = field(default_factory=lambda: ["goodput", "latency", "knee", "baseline"])
    """Which configs to confirm and export (``best-<pick>.yaml``): ``goodput`` (max goodput
    within the SLOs), ``throughput`` (max output tok/s), ``latency`` (lowest value of the first
    minimised objective), ``knee`` (the Pareto point nearest the ideal), ``baseline`` (vLLM's
    defaults, trial 0, re-measured beside the others: the reference every gain is measured against;
    without it the verdict is ``undetermined``). One trial chosen by several picks runs once."""
    rounds: int = 3
    """Every candidate runs once per round, each run on a fresh server, the rounds interleaved
    (A, B, defaults, A, B, defaults, ...): the spread between rounds is the noise a gain must beat
    (the 95 % interval of :mod:`tuner.verdict` needs 2 rounds or more). The stage costs rounds ×
    candidates server starts."""
    min_effect: float = 0.03
    """The smallest gain over vLLM's defaults (a fraction of the study's first objective) worth
    recommending a config for, even when its interval is above 0."""
    load_factor: float = 2.0
    """Concurrency, rate (and a trace's speed) × this."""
    duration_factor: float = 2.0
    """Requests and ``workload.duration_s`` × this. 2 by default: with 3 rounds of one seed, each
    candidate replays 6× the search's requests, as 2 seeds at 3× did on one server."""
    seeds: list[int] = field(default_factory=lambda: [1])
    """One stress run per seed (another request order and content) on each round's server; a
    round's value is its worst run. One seed by default: the rounds repeat it on fresh servers;
    ``[1, 2]`` adds a second request order to every round, at twice the replay time."""
    export_drop: list[str] = field(
        default_factory=lambda: ["host", "port", "served-model-name", "api-key"]
    )
    """Flags of the tuner's own launches left out of ``best-*.yaml``."""


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str = "sqlite:///mlflow.db"
    experiment: str | None = None
    """Default: the study name."""


@dataclass
class PathsConfig:
    root_dir: str = MISSING
    output_dir: str = MISSING
    """This invocation's run directory (Hydra's); trial artifacts go to ``trial_NNNN/`` below it."""
    state_dir: str = MISSING
    """Survives invocations: Optuna storage, compile cache."""


@dataclass
class TunerConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    space: SpaceConfig = field(default_factory=SpaceConfig)
    study: StudyConfig = field(default_factory=StudyConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    confirm: ConfirmConfig = field(default_factory=ConfirmConfig)
    workload: WorkloadConfig = MISSING
    dry_run: bool = False
    """Print the plan (study, space, first argv) and exit without launching anything."""


def register_schemas() -> None:
    """Register the schema in Hydra's ConfigStore and the ``${tuner_root:}`` resolver."""
    from hydra.core.config_store import ConfigStore

    if not OmegaConf.has_resolver("tuner_root"):
        root = str(Path(__file__).resolve().parent.parent)
        OmegaConf.register_new_resolver("tuner_root", lambda: root)
    ConfigStore.instance().store(name="tuner_schema", node=TunerConfig)


def compose_config(overrides: list[str]) -> DictConfig:
    """Compose with Hydra's compose API (tests, notebooks), as the CLI composes.

    Paths that come from Hydra's run (``paths.output_dir``) must be given in ``overrides``.
    :func:`tuner.checks.load_config` converts and checks the result.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    register_schemas()
    check_override_keys(overrides)
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return compose(config_name="config", overrides=overrides)
    except HydraException as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise ConfigError(" ".join(lines[:2])) from exc


def convert(cfg: DictConfig) -> TunerConfig:
    """Convert the composed Hydra config to :class:`TunerConfig`, unchecked beyond its types
    (:func:`tuner.checks.to_config` converts and checks).

    Raises :class:`ConfigError` with one line naming what is missing or mistyped.
    """
    if OmegaConf.is_missing(cfg, "workload"):
        raise ConfigError(
            f"no workload selected; add +workload=NAME (one of: {', '.join(available('workload'))})"
        )
    _check_composed_keys(cfg)
    try:
        obj = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as exc:
        key = getattr(exc, "full_key", "?")
        raise ConfigError(f"missing required config value {key}") from exc
    except OmegaConfBaseException as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"invalid config: {first} (key {getattr(exc, 'full_key', '?')})") from exc
    assert isinstance(obj, TunerConfig)
    return obj


# --- keys the schema does not have --------------------------------------------------------------
# Hydra refuses an unknown key of a structured config in a YAML file or an override, but an
# override with ``+`` (``+study.ntrials=5``, which Hydra's own message suggests) adds it, and
# OmegaConf.to_object would set it as a stray attribute nobody reads. Both are refused here with
# the closest known key. Dict-typed fields are free-form (``engine.env``, ``model.fixed_args``,
# ``workload.server_args``, the names under ``space.params``) and so are list entries of ``Any``.


def _optional_of(tp: Any) -> Any:
    """``X | None`` → ``X``; any other type as it is."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return tp


def unknown_key(path: Sequence[str]) -> str | None:
    """The one-line complaint about a key path (``["study", "ntrials"]``) that
    :class:`TunerConfig` has no field for, naming the closest known key; None for a known key, or
    one below a free-form field (a dict's own keys, an ``Any``) or below a scalar (a type error
    that OmegaConf reports)."""
    tp: Any = TunerConfig
    for i, key in enumerate(path):
        tp = _optional_of(tp)
        if dataclasses.is_dataclass(tp):
            hints = typing.get_type_hints(tp)
            names = [f.name for f in dataclasses.fields(tp)]
            if key not in names:
                where = ".".join(path[:i])
                (close,) = difflib.get_close_matches(key, names, n=1, cutoff=0.0) or names[:1]
                return (
                    f"unknown config key {'.'.join(path[: i + 1])}; "
                    f"the closest known key is {f'{where}.{close}' if where else close}"
                )
            tp = hints[key]
        elif typing.get_origin(tp) in (dict, list):
            tp = typing.get_args(tp)[-1]  # this key is a free name or an index: its value next
        else:
            return None
    return None


def check_override_keys(overrides: Sequence[str]) -> None:
    """Raise :class:`ConfigError` for a command-line override (``+study.ntrials=5`` or
    ``study.ntrials=5``) whose key the schema does not have, before Hydra composes (its own
    message for a key without ``+`` is several lines, and with ``+`` it adds the key).
    Hydra's own keys (``hydra.run.dir``), group paths (``hydra/launcher``), packages (``@``)
    and flags (``--cfg``) are Hydra's to judge."""
    for arg in overrides:
        if arg.startswith("-") and not arg.startswith("~"):
            continue
        key, sep, _ = arg.partition("=")
        key = key.lstrip("+~")
        if not key or not (sep or arg.startswith("~")) or "@" in key or "/" in key:
            continue
        path = key.split(".")
        if path[0] == "hydra":
            continue
        problem = unknown_key(path)
        if problem:
            raise ConfigError(problem)
    check_model_path(overrides)


def _model_choice(overrides: Sequence[str]) -> str | None:
    """The ``model`` option the overrides select (the last ``model=NAME``), else the default of
    ``conf/config.yaml``."""
    choice = None
    for arg in overrides:
        key, sep, value = arg.lstrip("+~").partition("=")
        if key == "model" and sep:
            choice = value
    if choice is None:
        primary = OmegaConf.load(conf_dir() / "config.yaml")
        for entry in primary.defaults if isinstance(primary, DictConfig) else []:
            if isinstance(entry, DictConfig) and "model" in entry:
                choice = str(entry["model"])
    return choice


def check_model_path(overrides: Sequence[str]) -> None:
    """Refuse ``model.path=...`` on a model option that asks for dummy weights (the shipped
    shapes): its name, ``max_model_len`` and load format belong to its own directory, and a
    run on another model with them would silently serve random weights. ``model=custom`` derives
    them from the path."""
    if not any(a.lstrip("+").startswith("model.path=") for a in overrides):
        return
    choice = _model_choice(overrides)
    option = conf_dir() / "model" / f"{choice}.yaml"
    if choice is None or not option.is_file():
        return
    shipped = OmegaConf.load(option)
    load_format = shipped.get("load_format") if isinstance(shipped, DictConfig) else None
    if load_format is None:
        return
    raise ConfigError(
        f"model.path is set on model={choice}, a shipped shape whose name, max_model_len and "
        f"load_format {load_format} belong to its own directory; for your model use "
        "model=custom model.path=PATH (add model.load_format=dummy for random weights)"
    )


def _key_paths(node: Any, prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """Every key path of a plain container (``OmegaConf.to_container``'s output)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*prefix, str(k))
            yield from _key_paths(v, (*prefix, str(k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _key_paths(v, (*prefix, str(i)))


def _check_composed_keys(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` for the first key of the composed config that the schema does
    not have (one a ``+`` override added)."""
    tree = OmegaConf.to_container(cfg, resolve=False)
    for path in _key_paths(tree, ()):
        problem = unknown_key(path)
        if problem:
            raise ConfigError(problem)


# --- semantic checks that types cannot express ---------------------------------------------
# The checks of what this module alone can judge (choices among its constants, ranges). Each
# stage checks what only it knows (its own ``check(cfg)``); tuner.checks runs them all, in order.

ENGINE_KINDS = ("sim", "vllm")
SAMPLERS = ("tpe", "random", "gp", "nsga2", "grid")
DIRECTIONS = ("maximize", "minimize")
PARAM_TYPES = ("float", "int", "categorical", "bool")
ENDPOINTS = ("chat", "completions")
ARRIVALS = ("concurrency", "poisson", "gamma", "constant", "ramp")
TRACE_FORMATS = ("auto", "csv", "jsonl")
TIMESTAMP_FORMATS = ("seconds", "datetime")
DISTS = ("fixed", "uniform", "normal", "lognormal")
CONFIRM_PICKS = ("goodput", "throughput", "latency", "knee", "baseline")


def one_of(what: str, value: object, allowed: tuple[str, ...]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(f"{what} is {value!r}; allowed: {', '.join(allowed)}")


def check_engine(c: TunerConfig) -> None:
    """``engine``: kind, command, loopback host, GPUs."""
    one_of("engine.kind", c.engine.kind, ENGINE_KINDS)
    if not c.engine.command:
        raise ConfigError("engine.command is empty; give the argv prefix, e.g. [vllm, serve]")
    if c.engine.host not in ("127.0.0.1", "localhost", "::1"):
        raise ConfigError(f"engine.host is {c.engine.host!r}; servers bind to loopback only")
    if not c.engine.gpus:
        raise ConfigError("engine.gpus is empty; list at least one GPU index, e.g. [0]")
    box = c.engine.container
    if box is not None and not (box.image and box.program):
        raise ConfigError("engine.container needs an image and a program, e.g. docker")


def check_study(c: TunerConfig) -> None:
    """``study``: sampler, workers, repeats, budget and trial counts."""
    one_of("study.sampler", c.study.sampler, SAMPLERS)
    if not 1 <= c.study.n_workers <= len(c.engine.gpus):
        raise ConfigError(
            f"study.n_workers is {c.study.n_workers}; allowed: 1 to {len(c.engine.gpus)} "
            f"(one per GPU in engine.gpus={c.engine.gpus})"
        )
    if not 1 <= c.study.repeats <= 20:
        raise ConfigError(f"study.repeats is {c.study.repeats}; allowed: 1 to 20")
    if c.study.timeout_s is not None and not c.study.timeout_s > 0:
        raise ConfigError(
            f"study.timeout_s is {c.study.timeout_s}; allowed: seconds > 0, or null for no limit"
        )
    if c.study.n_trials < 0:
        raise ConfigError(f"study.n_trials is {c.study.n_trials}; allowed: an integer >= 0")
    if c.study.max_rejected < 0:
        raise ConfigError(f"study.max_rejected is {c.study.max_rejected}; allowed: an integer >= 0")


def check_confirm(c: TunerConfig) -> None:
    """``confirm``: picks, factors, seeds, rounds, min_effect."""
    cc = c.confirm
    for p in cc.picks:
        one_of("confirm.picks entry", p, CONFIRM_PICKS)
    if cc.load_factor <= 0 or cc.duration_factor <= 0:
        raise ConfigError(
            f"confirm.load_factor is {cc.load_factor} and confirm.duration_factor is "
            f"{cc.duration_factor}; allowed: > 0 (1 = as in the search)"
        )
    if cc.enabled and cc.picks and not cc.seeds:
        raise ConfigError("confirm.seeds is empty; give at least one seed or confirm.enabled=false")
    if cc.rounds < 1:
        raise ConfigError(
            f"confirm.rounds is {cc.rounds}; allowed: an integer >= 1 (2 or more for an interval)"
        )
    if not 0.0 <= cc.min_effect < 1.0:
        raise ConfigError(f"confirm.min_effect is {cc.min_effect}; allowed: 0.0 to below 1.0")


def check_workload(c: TunerConfig) -> None:
    """``workload``: arrivals, length distributions, request count, client processes."""
    w = c.workload
    one_of("workload.arrival.kind", w.arrival.kind, ARRIVALS)
    for name, d in (("input_tokens", w.input_tokens), ("output_tokens", w.output_tokens)):
        one_of(f"workload.{name}.kind", d.kind, DISTS)
        if d.low < 1 or d.high < d.low:
            raise ConfigError(f"workload.{name} bounds [{d.low}, {d.high}]; need 1 <= low <= high")
    if w.num_requests < 1:
        raise ConfigError(f"workload.num_requests is {w.num_requests}; allowed: >= 1")
    cores = usable_cores()
    procs = w.client_processes
    if procs != "auto" and (
        not isinstance(procs, int) or isinstance(procs, bool) or not 1 <= procs <= cores
    ):
        raise ConfigError(
            f"workload.client_processes is {procs!r}; allowed: auto, or 1 to {cores} "
            "(the CPU cores this process may use)"
        )
    if w.arrival.kind == "concurrency" and w.arrival.concurrency < 1:
        raise ConfigError(f"workload.arrival.concurrency is {w.arrival.concurrency}; allowed: >= 1")
    if w.arrival.kind not in ("concurrency", "ramp") and w.arrival.rate <= 0:
        raise ConfigError(f"workload.arrival.rate is {w.arrival.rate}; allowed: > 0 requests/s")
    if w.arrival.kind == "ramp":
        a = w.arrival
        if a.ramp_start_rate is None or a.ramp_start_rate < 0:
            raise ConfigError(
                f"workload.arrival.ramp_start_rate is {a.ramp_start_rate}; allowed: >= 0 requests/s"
            )
        if a.ramp_end_rate is None or a.ramp_end_rate <= 0:
            raise ConfigError(
                f"workload.arrival.ramp_end_rate is {a.ramp_end_rate}; allowed: > 0 requests/s"
            )
    if w.arrival.kind in ("gamma", "ramp") and w.arrival.burstiness <= 0:
        raise ConfigError(f"workload.arrival.burstiness is {w.arrival.burstiness}; allowed: > 0")
    if w.arrival.max_concurrency is not None and w.arrival.max_concurrency < 1:
        raise ConfigError(
            f"workload.arrival.max_concurrency is {w.arrival.max_concurrency}; "
            "allowed: >= 1 or null"
        )


def check_images(c: TunerConfig) -> None:
    """``workload.images``: counts, size pairs, formats, the chat endpoint (the sizes against the
    model's limit: :func:`tuner.workload.images.check`)."""
    w = c.workload
    if w.images is not None:
        im = w.images
        if not 0 <= im.min_count <= im.max_count:
            raise ConfigError(
                f"workload.images count [{im.min_count}, {im.max_count}]; need 0 <= min <= max"
            )
        if not im.sizes or any(len(s) != 2 or min(s) < 1 for s in im.sizes):
            raise ConfigError("workload.images.sizes must be a list of [width, height] pairs")
        for f in im.formats:
            one_of("workload.images format", f, ("jpeg", "png"))
        if w.endpoint != "chat":
            raise ConfigError("workload.images needs workload.endpoint=chat")


def check_model(c: TunerConfig) -> None:
    """``model.path``'s files (a directory, or the repo's snapshot: :mod:`tuner.model_source`)
    have ``config.json``; the load format is given once."""
    m = c.model
    if not (m.files / "config.json").is_file():
        raise ConfigError(f"model.path {m.path!r} has no config.json")
    if m.load_format is not None and "load-format" in m.fixed_args:
        raise ConfigError(
            "the load format is given twice (model.load_format and "
            "model.fixed_args.load-format); keep model.load_format"
        )


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    import os

    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def conf_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "conf"


def available(group: str) -> list[str]:
    """Option names of a config group (the YAML files in ``conf/<group>/``)."""
    d = conf_dir() / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []
