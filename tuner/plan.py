"""``dry_run=true``: show what a study would do, launch nothing."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from tuner.config import TunerConfig, WorkloadConfig, chosen_levers
from tuner.engine.argv import (
    build_env,
    cache_root,
    command_missing,
    command_prefix,
    flag_args,
    mask_argv,
    secret_values,
    trial_argv,
)
from tuner.engine.container import CIDFILE, wrap
from tuner.engine.pool import cpu_layout, describe_cores
from tuner.engine.preload import entry_of
from tuner.records import RequestSpec
from tuner.recovery import LEASE_ENV
from tuner.replay import IN_PROCESS_STREAMS, STREAMS_PER_PROCESS, choose_client
from tuner.score import needs_capacity
from tuner.space import defaults, defaults_outside, distributions, flag_name
from tuner.vllm_rules import numerics_changes
from tuner.workload import load_trace

if TYPE_CHECKING:
    import optuna

__all__ = ["print_plan"]

SPACE_DRAWS = 1000
"""Uniform draws from the space whose precheck verdicts the plan summarises."""


def print_plan(cfg: TunerConfig, console: Console | None = None) -> None:
    from tuner.storage import study_name
    from tuner.workload import build_requests

    console = console or Console()
    console.print(f"study {study_name(cfg)} · engine {cfg.engine.kind} · model {cfg.model.name}")
    _print_model(cfg, console)
    w = cfg.workload
    if w.trace is not None:  # its rows are the requests; num_requests is not used
        rows = len(load_trace(w.trace))
        console.print(
            f"workload {w.name}: {rows} requests (the rows of {w.trace.path})", markup=False
        )
    else:
        console.print(f"workload {w.name}: {w.num_requests} requests")
    console.print(_objective_line(cfg), markup=False)
    if cfg.mode == "screen":
        _print_screen(cfg, console)
    else:
        for name, dist in distributions(cfg.space).items():
            console.print(f"  {name}: {dist}")
        _print_argv(cfg, console)
        stored = _stored_line(cfg)
        if stored is not None:
            console.print(stored, markup=False)
    if cfg.engine.container is not None:
        console.print(f"each server in a container: {_container_line(cfg)}", markup=False)
    if cfg.engine.preload:
        console.print(_preload_line(cfg), markup=False)
    missing = command_missing(cfg.engine)
    if missing:
        console.print(
            f"note: {missing}; the study would stop there, before storing anything",
            markup=False,
        )
    requests = build_requests(cfg.workload, cfg.model.files)
    if cfg.mode != "screen":
        _print_refusals(cfg, requests, console)
    _print_client(cfg, requests, console)
    _print_cores(cfg, console)
    ps = cfg.study.prescreen
    if ps.trials:
        console.print(
            f"first: prescreen {ps.trials} configs on the simulator's landscape, then launch its "
            f"best {ps.top} (once per study)"
        )
    cc = cfg.confirm
    if cfg.mode == "screen":
        console.print("then the screen's table, screen.json, screen.csv and screen.html")
    elif cc.enabled and cc.picks:
        console.print(
            f"then confirm {', '.join(cc.picks)} at {cc.load_factor:g}x load, "
            f"{cc.duration_factor:g}x duration, seeds {list(cc.seeds)}, {cc.rounds} round(s) "
            f"(a fresh server per pick per round: up to {len(cc.picks) * cc.rounds} server "
            "starts); export best-<pick>.yaml"
        )
    else:
        console.print(f"then export best-<pick>.yaml for {', '.join(cc.picks) or 'no pick'}")
    console.print(f"state dir {Path(cfg.paths.state_dir).resolve()}")
    root = cache_root(cfg)
    where = f"{root.resolve()} (VLLM_CACHE_ROOT)" if root else "not set (the engine's default)"
    console.print(f"compile cache {where}")


def _objective_line(cfg: TunerConfig) -> str:
    """What each trial is scored by: the objectives, and under a capacity objective how its
    capacity is searched (``objective.capacity``) against which SLOs."""
    o = cfg.objective
    names = ", ".join(f"{x.metric} ({x.direction[:3]})" for x in o.objectives)
    if not needs_capacity(o):
        return f"objective: {names}"
    c, slo = o.capacity, cfg.workload.slo
    held = ", ".join(
        f"{m} <= {lim:g} ms"
        for m, lim in (("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms), ("E2E", slo.e2e_ms))
        if lim is not None
    )
    probe = (
        "; once the study has a capacity, the incumbent's load first" if c.incumbent_probe else ""
    )
    return (
        f"objective: {names}; SLO capacity: the highest load with {held or 'no SLO'} at "
        f"p{o.slo_percentile}, searched on each trial's server after its own replay (at most "
        f"{c.max_steps} replays, to {c.rel_width:.0%}){probe}"
    )


def _print_model(cfg: TunerConfig, console: Console) -> None:
    """The model's path and files, its max_model_len and weights, and the GPU the memory model
    predicts for (:func:`tuner.precheck.gpu_of`)."""
    from tuner.precheck import gpu_of

    m = cfg.model
    files = "" if m.files == Path(m.path) else f" (files from {m.files})"
    weights = (
        "vLLM's default load format (the real weights)"
        if m.load_format is None
        else f"load format {m.load_format}"
    )
    console.print(
        f"model path {m.path}{files}: max_model_len {m.max_model_len}, {weights}", markup=False
    )
    gpu = gpu_of(cfg)
    console.print(f"memory model GPU: {gpu.source}", markup=False)
    if gpu.note:
        console.print(f"note: {gpu.note}", markup=False)


def _print_screen(cfg: TunerConfig, console: Console) -> None:
    """The lever screen's servers in order (a new screen's, and where the study is stored, the
    servers this run adds to it: :func:`_continued_order`) and the flag each lever adds to the
    defaults' command line."""
    from tuner.screen import DEFAULTS
    from tuner.screen import plan as order_of
    from tuner.storage import study_name

    sc = cfg.screen
    levers = chosen_levers(sc)
    order = order_of(list(levers), {n: sc.servers for n in levers}, sc.defaults_every)
    argv = trial_argv(cfg, defaults(cfg.space), port=0, baseline=True)
    argv[argv.index("--port") + 1] = "<free port>"
    shown = " ".join(mask_argv(argv, secret_values(cfg.engine, model=cfg.model)))
    console.print(
        f"lever screen: {len(levers)} lever(s) x {sc.servers} fresh server(s), vLLM's defaults "
        f"{order.count(DEFAULTS)} times: {len(order)} server starts for a new screen, each "
        "measuring its SLO capacity (the incumbent probe off)",
        markup=False,
    )
    console.print(f"order: {' '.join(order)}", markup=False)
    resumed = _continued_order(cfg)
    if resumed is not None:
        stored, left = resumed
        console.print(
            f"stored: study {study_name(cfg)} has {stored} screen server(s); this run continues "
            f"it: {' '.join(left) if left else 'nothing left to run'}",
            markup=False,
        )
    console.print(f"the defaults: {shown}", markup=False)
    for name, lever in levers.items():
        words = flag_args(flag_name(lever.param, cfg.space.params[lever.param]), lever.value)
        numerics = " (changes numerics)" if numerics_changes({lever.param: lever.value}) else ""
        console.print(f"  {name}: the same plus {' '.join(words)}{numerics}", markup=False)


def _stored(cfg: TunerConfig) -> tuple[optuna.storages.BaseStorage, str] | None:
    """Where ``study.storage`` holds the study ``cfg`` names: that storage (the callers only read
    it) and the name; None where there is none. A SQLite file that does not exist is not
    created, and a database without Optuna's tables is not given them."""
    import optuna

    from tuner.storage import storage_url, study_name
    from tuner.stores import check_database, missing_sqlite

    url = storage_url(cfg)
    if missing_sqlite(url):
        return None
    try:
        check_database(url, "study.storage")  # a server that is down: 10 s at most, not a hang
        storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
        names = {s.study_name for s in storage.get_all_studies()}
    except Exception:  # noqa: BLE001  # no tables, no server: the run reports it, not the plan
        return None
    name = study_name(cfg)
    return (storage, name) if name in names else None


def _continued_order(cfg: TunerConfig) -> tuple[int, list[str]] | None:
    """Where ``study.storage`` holds this screen's study: how many screen servers it stored, and
    the arms its continuation would run, in order (:func:`tuner.screen.prepare` on an in-memory
    copy: nothing is written); None for a new screen. A continuation the screen refuses raises
    its ConfigError here, as the run would."""
    import optuna

    from tuner import stored_trial
    from tuner.prescreen import quiet_optuna
    from tuner.screen import prepare
    from tuner.screen_resume import waiting_servers

    source = _stored(cfg)
    if source is None:
        return None
    storage, name = source
    memory = optuna.storages.InMemoryStorage()
    with quiet_optuna():
        optuna.copy_study(from_study_name=name, from_storage=storage, to_storage=memory)
    study = optuna.load_study(study_name=name, storage=memory)
    stored = sum(stored_trial.screen_arm(t) is not None for t in study.get_trials(deepcopy=False))
    prepare(study, cfg)
    return stored, [str(stored_trial.screen_arm(t)) for t in waiting_servers(study)]


def _stored_line(cfg: TunerConfig) -> str | None:
    """A search continued from storage: what the stored study holds, and that ``n_trials`` more
    are run on top (the same command continues a study)."""
    from collections import Counter

    import optuna

    source = _stored(cfg)
    if source is None:
        return None
    storage, name = source
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    states = Counter(t.state.name.lower() for t in trials)
    held = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    return (
        f"stored: study {name} has {len(trials)} trial(s)"
        + (f" ({held})" if held else "")
        + f"; this run adds up to {cfg.study.n_trials} more (study.n_trials)"
    )


def _print_argv(cfg: TunerConfig, console: Console) -> None:
    """The command line every trial shares (the baseline's: no searched flag), and the flags a
    searched trial adds to it."""
    argv = trial_argv(cfg, defaults(cfg.space), port=0, baseline=True)
    argv[argv.index("--port") + 1] = "<free port>"
    shown = " ".join(mask_argv(argv, secret_values(cfg.engine, model=cfg.model)))
    flags = " ".join(flag_name(n, s) for n, s in cfg.space.params.items() if s.enabled)
    outside = defaults_outside(cfg.space)
    if cfg.study.baseline_first and not outside:
        console.print(
            f"baseline trial (vLLM's defaults, no searched flag passed): {shown}", markup=False
        )
        if flags:
            console.print(f"searched trials: the same plus their value of {flags}", markup=False)
        return
    why = (
        "study.baseline_first=false"
        if not cfg.study.baseline_first
        else f"vLLM's default of {', '.join(outside)} is outside the searched range"
    )
    console.print(f"no baseline trial ({why})", markup=False)
    console.print(
        f"every trial: {shown}" + (f" plus its value of {flags}" if flags else ""), markup=False
    )


def _preload_line(cfg: TunerConfig) -> str:
    """``engine.preload``: which interpreter and entry point the zygote runs, or why each server
    will start as a process instead."""
    entry = entry_of(command_prefix(cfg.engine))
    if isinstance(entry, str):
        return f"engine.preload: {entry}; each server will start as a process"
    modules = ", ".join(cfg.engine.preload_modules) or "none"
    return (
        f"engine.preload: each server forked from one {entry.python} that imported "
        f"{entry.entry} (and {modules}) once"
    )


def _container_line(cfg: TunerConfig) -> str:
    """``engine.container``: the ``docker run`` that wraps the command above (its options; the
    model and flags follow the image as shown)."""
    argv, _ = wrap(
        cfg.engine,
        list(cfg.engine.command),
        build_env(cfg.engine, cache_root=cache_root(cfg)),
        model_path=cfg.model.path,
        cache_root=cache_root(cfg),
        gpus=["<lease>"],
        cidfile=f"<trial dir>/{CIDFILE}",
        name="tuner-<study>-<trial>-<port>",
        extra_env=[LEASE_ENV],
    )
    return " ".join(argv) + " <model and flags as above>"


def _loop(w: WorkloadConfig) -> str:
    """How the replay sends: closed loop (a fixed number in flight) or open loop (send times
    from the arrival process or the trace, capped by ``arrival.max_concurrency``)."""
    a = w.arrival
    if w.trace is not None:
        line = f"open loop at the trace's send times (time_scale {w.trace.time_scale:g})"
    elif a.kind == "concurrency":
        return f"closed loop, {a.concurrency} requests in flight"
    else:
        rate = (
            f"{a.ramp_start_rate:g} to {a.ramp_end_rate:g} requests/s"
            if a.kind == "ramp"
            else f"{a.rate:g} requests/s"
        )
        line = f"open loop: {a.kind} arrivals at {rate}"
    if a.max_concurrency:
        return line + f", at most {a.max_concurrency} requests in flight"
    return line + ", no cap on requests in flight (workload.arrival.max_concurrency)"


def _print_client(cfg: TunerConfig, requests: list[RequestSpec], console: Console) -> None:
    """How many replay client processes the workload's replay takes, and why
    (:func:`tuner.replay.choose_client`); with ``auto``, also at the confirm stage's load; a note
    when a process would have more streams than ``auto`` gives one."""
    w = cfg.workload
    choice = choose_client(w, cfg.engine, requests)
    console.print(f"replay client on {w.client_loop}: {choice.describe()}")
    console.print(f"  {_loop(w)}", markup=False)
    cc = cfg.confirm
    if choice.auto:
        from tuner.confirm import stressed
        from tuner.workload import build_requests

        line = "  auto chooses again for each replay's own load (capacity steps, confirm runs)"
        if cc.enabled and cc.picks and cc.load_factor != 1:
            harder = stressed(w, cc, w.seed)
            at = choose_client(harder, cfg.engine, build_requests(harder, cfg.model.files))
            line += f"; at the confirm stage's {cc.load_factor:g}x: {at.describe()}"
        console.print(line)
    if choice.processes < choice.wanted:
        per = math.ceil(choice.in_flight / choice.processes)
        where = "in the tuner's own process" if choice.processes == 1 else "per client process"
        console.print(
            f"note: {per} streams {where}: the client adds latency of its own at p99 above "
            f"{STREAMS_PER_PROCESS} streams a process, {IN_PROCESS_STREAMS} in the tuner's own "
            "(1,000 paced streams: 30-40 ms with one process, under 1 ms with 24; "
            f"docs/replay-accuracy.md); auto would take {choice.wanted} processes given the "
            "cores; every trial records client_lag_p99_ms and client_processes"
        )


def _print_cores(cfg: TunerConfig, console: Console) -> None:
    """Where the servers and the tuner (with its replay client) will run."""
    cpus = sorted(os.sched_getaffinity(0))
    if not cfg.engine.cpu_pinning:
        console.print(
            f"CPU cores: not pinned; servers, the tuner and its replay client share "
            f"{len(cpus)} cores (engine.cpu_pinning=true gives each its own)"
        )
        return
    own, plan = cpu_layout(cfg.engine.gpus, cfg.engine.cpu_reserve)  # validated at load
    console.print(f"CPU cores: {describe_cores(own, plan)}")


def refusal_shares(
    cfg: TunerConfig,
    draws: int = SPACE_DRAWS,
    seed: int = 0,
    requests: list[RequestSpec] | None = None,
) -> dict[str, float]:
    """The share of ``draws`` uniform draws from the space that the precheck refuses before
    launch, per failure reason (what random search would meet; TPE learns to avoid them), for
    the workload's ``requests`` (built here if not given)."""
    import optuna

    from tuner.memory import ModelShape
    from tuner.precheck import refusal
    from tuner.prescreen import quiet_optuna
    from tuner.workload import build_requests

    dists = distributions(cfg.space)
    shape = ModelShape.from_dir(cfg.model.files)
    if requests is None:
        requests = build_requests(cfg.workload, cfg.model.files)
    counts: dict[str, int] = {}
    with quiet_optuna():
        sampler = optuna.samplers.RandomSampler(seed=seed)
        study = optuna.create_study(sampler=sampler)  # in memory: nothing is stored
        for _ in range(draws):
            trial = study.ask(dists)
            reason = refusal(cfg, shape, trial.params, requests)
            if reason is not None:
                counts[reason] = counts.get(reason, 0) + 1
            study.tell(trial, 0.0)
    return {reason: n / draws for reason, n in sorted(counts.items(), key=lambda kv: -kv[1])}


def _print_refusals(cfg: TunerConfig, requests: list[RequestSpec], console: Console) -> None:
    """How much of the space the precheck refuses, and what that means for ``n_trials``."""
    if not cfg.study.precheck or not distributions(cfg.space):
        return
    shares = refusal_shares(cfg, requests=requests)
    total = sum(shares.values())
    detail = ", ".join(
        f"{reason} {share:.0%}" if share >= 0.01 else f"{reason} <1%"
        for reason, share in shares.items()
    )
    console.print(
        f"precheck: refuses {total:.0%} of {SPACE_DRAWS} random configs from this space"
        + (f" ({detail})" if detail else "")
        + f"; they cost no GPU time and do not count toward study.n_trials (at most "
        f"study.max_rejected={cfg.study.max_rejected} per run)"
    )
    if total >= 0.5:
        console.print(
            f"note: {total:.0%} of the space cannot start; narrow space.params (the reasons "
            "above say which limit is hit)"
        )
