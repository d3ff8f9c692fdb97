"""The search and what follows it: ``space`` (the searched flags), ``study`` (the sampler, the
budget, the queue, the prescreen), ``objective`` (with the SLO-capacity search) and ``confirm``."""

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

__all__ = [
    "CapacityConfig",
    "ConfirmConfig",
    "ObjectiveConfig",
    "ObjectiveSpec",
    "ParamSpec",
    "PlanConfig",
    "PrescreenConfig",
    "QUALITY_MEASURES",
    "QualityConfig",
    "SpaceConfig",
    "StudyConfig",
]


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
    real_weights: bool = False
    """Searched only when the model's weights are real: on dummy weights (``model.load_format``
    ``dummy``) the param stays at its default, with a log line (e.g. speculative decoding,
    whose acceptance depends on what the model writes)."""


@dataclass
class SpaceConfig:
    params: dict[str, ParamSpec] = field(default_factory=dict)


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
    deadline_s: float | None = None
    """A hard end for this invocation, search and confirm stage, in seconds from its start
    (:mod:`tuner.deadline`): a server starts only where one more fits before it, going by the
    mean wall time of the study's servers; none is cut short. The confirm stage stores no verdict
    until every server has run; the same command continues the study where it stopped."""
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
    """Highest load tried; a config that holds there is recorded as ``capacity_censored`` 1."""
    requests: int | None = None
    """Measured requests of each further replay (default: the workload's ``num_requests``)."""
    incumbent_probe: bool = True
    """Once the study has a measured capacity, each trial tries the incumbent's load right after
    its own and ends there on a loss, its capacity censored above (``capacity_censored`` -1).
    false: every trial brackets its own capacity from the workload's load (e.g. to measure the
    spread of one config's capacity)."""
    stall_ms: float = 500.0
    """A step during which the measuring side stalled this long while its counted requests ran
    is replayed once (at most twice a search), and the search goes on from the second replay
    (:func:`tuner.capacity_probe.stall_of`: the replay client's longest event-loop delay, or the
    simulator's latest stream chunk); 0: never. Why 500: on 2 cores the quick start under
    ``objective=capacity`` (2026-12-04, 74 steps at up to ~500 in flight) saw at most 296 ms
    (49 ms of the client's), and steps replayed at 100-300 ms moved their margins by at most
    0.03 and their rates by about 1 % (44 pairs); a 1 s stall moved a capacity from ~64 to ~37
    req/s (``tests/integration/test_capacity_study.py``)."""
    predict_start: bool = True
    """Before the study has a capacity (and without ``study.warm_start``), a trial's search goes
    after its own replay to the capacity the simulator's landscape predicts for its config
    (:func:`tuner.prescreen.predict_start`: a prediction, a loss there caps nothing); false:
    it doubles from the workload's load."""


@dataclass
class ObjectiveConfig:
    """What a study optimises (``conf/objective/``). The default is ``objective=capacity``: the
    SLO capacity (``capacity_rps``) against p95 TTFT at the workload's own load."""

    objectives: list[ObjectiveSpec] = field(
        default_factory=lambda: [
            ObjectiveSpec("capacity_rps", "maximize"),
            ObjectiveSpec("ttft_p95_ms", "minimize"),
        ]
    )
    max_error_rate: float = 0.05
    """A trial whose failed-request share exceeds this violates a constraint."""
    slo_constraints: bool = False
    """Each SLO the workload sets (``workload.slo``) becomes a constraint on its percentile
    (false under capacity: it counts only loads that meet every SLO already)."""
    slo_percentile: int = 95
    """The percentile of TTFT/TPOT/E2E that must meet the SLO (50, 90, 95 or 99)."""
    prune: bool = True
    """Stop a replay once a constraint is lost beyond doubt (too many requests over an SLO or
    failed); the trial is PRUNED with its partial metrics."""
    capacity: CapacityConfig = field(default_factory=CapacityConfig)


DEFAULT_PICKS = ("goodput", "latency", "knee", "baseline")
"""``confirm.picks`` unless set. A capacity objective sets its own
(``conf/objective/capacity.yaml``: ``capacity`` in place of ``goodput``, goodput at the
workload's own load, which a capacity study does not rank by; on the quick start under capacity
it confirmed a trial whose capacity was censored below the defaults', 3 servers of 7 replays
each)."""


QUALITY_MEASURES = ("answer_rate", "exact_match")
"""What ``confirm.quality.min_agreement`` bounds (:mod:`tuner.quality_guard`)."""


@dataclass
class QualityConfig:
    """The confirm stage's quality guard (:mod:`tuner.quality_guard`, docs/quality.md): a pick
    whose flags change numerics answers the eval set as vLLM's defaults do, or it is demoted."""

    enabled: bool = True
    """false: no eval replay; a pick that changes numerics is recommended unchecked, and the
    verdict says so."""
    measure: str = "answer_rate"
    """``answer_rate``: the candidate's share of the eval items it answers (the stated answer in
    its output) over the defaults' share, in the same round; ``exact_match``: the share of its
    outputs identical to the defaults'."""
    min_agreement: float = 0.9
    """A pick whose worst round is below this is demoted (reason ``quality``)."""
    evalset: str | None = None
    """A JSON-lines eval set (tuner.quality); null: ``workloads/quality/eval-v1.jsonl``."""
    limit: int | None = None
    """Replay only the eval set's first N items (null: all)."""
    max_tokens: int = 64
    """Output tokens per eval item (greedy, a fixed length)."""
    concurrency: int = 32
    """Eval requests in flight."""


@dataclass
class ConfirmConfig:
    """After the search: re-run the best configs longer and harder, then export them."""

    enabled: bool = True
    """false: skip the stress runs; the picks are still exported (marked unconfirmed)."""
    picks: list[str] = field(default_factory=lambda: list(DEFAULT_PICKS))
    """Which configs to confirm and export (``best-<pick>.yaml``): ``capacity`` (max SLO
    capacity; in place of ``goodput`` among a capacity objective's picks,
    ``conf/objective/capacity.yaml``), ``goodput`` (max goodput
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
    stop_losers: bool = True
    """From the third round on, a pick whose 95 % interval against vLLM's defaults (on the study's
    first objective, over the rounds run so far: 2 or more on each side) lies wholly below
    ``min_effect`` runs no more rounds (:class:`tuner.confirm_stop.EarlyStop`): the verdict claims a
    gain only where the point gain reaches ``min_effect``, which a further round would have to
    carry past that interval. Below 0 the verdict stays "measured worse". The defaults stop too once
    every pick has; otherwise they run all ``rounds``. It saves a server per skipped round."""
    stop_winner: bool = True
    """From the third round on, once the verdict on the rounds run so far is a gain whose 95 %
    interval lies wholly above ``min_effect`` and whose pick measured the best point gain of all
    (:func:`tuner.confirm_stop.settled_winner`), no candidate runs more rounds: the verdict is the
    one on those rounds. It saves every server of the rounds left on a clear gain (an fp8 pick's
    +25-35 %: 6 servers of 9 on the simulator's lever grid)."""
    load_factor: float = 2.0
    """Concurrency, rate (and a trace's speed) × this."""
    duration_factor: float = 2.0
    """Requests and ``workload.duration_s`` × this. 2 by default: with 3 rounds of one seed, each
    candidate replays 6× the search's requests, as 2 seeds at 3× did on one server. 1 under a
    capacity objective (``conf/objective/capacity.yaml``): each capacity step already sends at
    least 3 requests per slot in flight at the capacity."""
    seeds: list[int] = field(default_factory=lambda: [1])
    """One stress run per seed (another request order and content) on each round's server; a
    round's value is its worst run. One seed by default: the rounds repeat it on fresh servers;
    ``[1, 2]`` adds a second request order to every round, at twice the replay time."""
    export_drop: list[str] = field(
        default_factory=lambda: ["host", "port", "served-model-name", "api-key"]
    )
    """Flags of the tuner's own launches left out of ``best-*.yaml``."""
    quality: QualityConfig = field(default_factory=QualityConfig)
    """The quality guard of picks whose flags change numerics."""


@dataclass
class PlanConfig:
    """The capacity card (:mod:`tuner.capacity_card`, with ``objective=capacity``): capacity per
    SLO tier, servers for a target load and the cost per million tokens, from measured capacity."""

    slo_scales: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])
    """SLO tiers: every limit of ``workload.slo`` × each scale (< 1 stricter, > 1 looser); the
    workload's own (1.0) is always on the card."""
    target_rps: float | None = None
    """The traffic to plan for, in requests/s: servers and GPUs needed. Unset: a trace
    workload's peak rate (the most arrivals in ``peak_window_s``, at the trace's own speed);
    else no plan of servers."""
    peak_window_s: float = 60.0
    """The window of a trace's peak rate (when ``target_rps`` is unset)."""
    gpu_hour_usd: float | None = None
    """The price of one GPU-hour: cost per 1M output tokens and per 1M requests at capacity."""
