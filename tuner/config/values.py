"""The config's own checks of what types cannot express: choices among the constants below,
ranges, counts, the model directory. Each stage checks what only it knows (its own
``check(cfg)``); :data:`tuner.checks.CHECKS` runs them all, in order."""

import math

from tuner.config.compose import TunerConfig
from tuner.config.search import QUALITY_MEASURES
from tuner.errors import ConfigError

__all__ = [
    "ARRIVALS",
    "CONFIRM_PICKS",
    "DIRECTIONS",
    "DISTS",
    "ENDPOINTS",
    "ENGINE_KINDS",
    "PARAM_TYPES",
    "SAMPLERS",
    "TIMESTAMP_FORMATS",
    "TRACE_FORMATS",
    "check_confirm",
    "check_engine",
    "check_images",
    "check_model",
    "check_plan",
    "check_study",
    "check_workload",
    "one_of",
    "usable_cores",
]

ENGINE_KINDS = ("sim", "vllm")
SAMPLERS = ("tpe", "random", "gp", "nsga2", "grid")
DIRECTIONS = ("maximize", "minimize")
PARAM_TYPES = ("float", "int", "categorical", "bool")
ENDPOINTS = ("chat", "completions")
ARRIVALS = ("concurrency", "poisson", "gamma", "constant", "ramp")
TRACE_FORMATS = ("auto", "csv", "jsonl")
TIMESTAMP_FORMATS = ("seconds", "datetime")
DISTS = ("fixed", "uniform", "normal", "lognormal")
CONFIRM_PICKS = ("capacity", "goodput", "throughput", "latency", "knee", "baseline")


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
    if box is not None and c.engine.preload:
        raise ConfigError(
            "engine.preload forks servers on this machine, engine.container runs each in a "
            "container: set engine.preload=false"
        )


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
    for key, seconds in (("timeout_s", c.study.timeout_s), ("deadline_s", c.study.deadline_s)):
        if seconds is not None and not seconds > 0:
            raise ConfigError(
                f"study.{key} is {seconds}; allowed: seconds > 0, or null for no limit"
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
    q = cc.quality
    one_of("confirm.quality.measure", q.measure, QUALITY_MEASURES)
    if not 0.0 <= q.min_agreement <= 1.0:
        raise ConfigError(
            f"confirm.quality.min_agreement is {q.min_agreement}; allowed: 0.0 to 1.0"
        )
    for key, n in (
        ("limit", q.limit),
        ("max_tokens", q.max_tokens),
        ("concurrency", q.concurrency),
    ):
        if n is not None and n < 1:
            raise ConfigError(f"confirm.quality.{key} is {n}; allowed: an integer >= 1")


def check_plan(c: TunerConfig) -> None:
    """``plan``: a positive target load, GPU-hour price and SLO scales."""
    p = c.plan
    if p.target_rps is not None and not (math.isfinite(p.target_rps) and p.target_rps > 0):
        raise ConfigError(f"plan.target_rps is {p.target_rps}; allowed: > 0 requests/s (or null)")
    if p.gpu_hour_usd is not None and not (math.isfinite(p.gpu_hour_usd) and p.gpu_hour_usd > 0):
        raise ConfigError(f"plan.gpu_hour_usd is {p.gpu_hour_usd}; allowed: > 0 (or null)")
    if not (math.isfinite(p.peak_window_s) and p.peak_window_s > 0):
        raise ConfigError(f"plan.peak_window_s is {p.peak_window_s}; allowed: > 0 seconds")
    bad = [s for s in p.slo_scales if not (math.isfinite(s) and s > 0)]
    if bad:
        raise ConfigError(
            f"plan.slo_scales has {bad[0]}; allowed: factors > 0 on the SLO limits, "
            "e.g. [0.5, 1, 2]"
        )


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
