"""The lever screen (``mode=screen``): which vLLM flags move SLO capacity, each alone against
vLLM's defaults.

The screen is a study like any other (:mod:`tuner.study`), so storage, resume, MLflow and
``report`` are the study's: :func:`prepare` enqueues one fixed trial per fresh server, each
labelled with its arm (:func:`tuner.stored_trial.screen_attrs`: a lever of ``screen.levers`` —
one flag changed from vLLM's defaults — or ``defaults``, which passes no flag), in the order
:func:`plan` gives: the defaults first, after every ``screen.defaults_every`` lever servers, and
last. Every trial measures its server's SLO capacity (``objective=capacity`` with the incumbent
probe off: each lever needs its own capacity, not one censored at the best so far; with
``screen.predict_start`` a server tries its config's own crossing so far first, else the
defaults' capacity, as a prediction that caps nothing: :func:`tuner.storage.search_start`). A
lever whose
server cannot start (a flag vLLM rejects) is a failed trial, recorded and shown as that lever's
failure; the screen goes on. Ctrl-C marks the running trial FAIL (``interrupted``): the table
shows it, and the same command runs it again with what was not run yet.

:func:`rows` reads the stored trials back as one :class:`LeverRow` per lever: its capacity change
against the defaults with a 95 % interval (:func:`change`) and a verdict word (:func:`word`).
A screen continued on another machine (``screen.servers`` raised, or a study carried from one
GPU machine to the next) compares each lever server with the defaults of its own machine: two
H100s read vLLM's defaults 56-62 and 66-68 req/s, and pooled, two levers measured on the faster
one read +8 and +9 % where they were -1.6 and -0.8 % beside its own defaults.
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import optuna

from tuner import screen_resume, stored_trial
from tuner.config import TunerConfig, chosen_levers
from tuner.engine.argv import flag_args
from tuner.errors import ConfigError
from tuner.quality_guard import screen_quality
from tuner.score import PER_GPU, needs_capacity
from tuner.screen_resume import DEFAULTS, METRIC, RoundEnd, capacity_of
from tuner.space import defaults, disable_real_weights
from tuner.stored_study import (
    objective_names,
    screen_levers,
    store_screen,
    stored_rel_width,
)
from tuner.verdict import Gain, gain, gain_in_blocks, gain_of_one
from tuner.vllm_rules import numerics_changes

__all__ = [
    "DEFAULTS",
    "FOLLOW_UP_SERVERS",
    "METRIC",
    "METRICS",
    "WORDS",
    "LeverRow",
    "bracket_floor",
    "change",
    "check",
    "plan",
    "prepare",
    "real_weights_only",
    "round_end",
    "rows",
    "screen_metric",
    "word",
]

log = logging.getLogger("tuner")

METRICS = (METRIC, PER_GPU)
"""What a screen compares: SLO capacity (``objective=capacity``, the default), or SLO capacity
per GPU (``objective=capacity_per_gpu``: a layout screen, ``screen=layouts``, where a lever
changes the GPUs a server uses)."""
FOLLOW_UP_SERVERS = 3
"""Fresh servers per arm that decide a lever (issue #30's follow-up: 3 + 3)."""
WORDS = ("gain", "loss", "no significant change", "no interval", "failed", "not run yet")


def check(cfg: TunerConfig) -> None:
    """``mode`` and, for a screen, its settings and objective."""
    if cfg.mode not in ("search", "screen"):
        raise ConfigError(f"mode is {cfg.mode!r}; allowed: search, screen")
    if cfg.mode != "screen":
        return
    sc = cfg.screen
    unknown = [n for n in sc.only if n not in sc.levers]
    if unknown:
        raise ConfigError(f"screen.only names {unknown}, not levers of {sorted(sc.levers)}")
    if DEFAULTS in sc.levers:
        raise ConfigError(f"screen.levers: {DEFAULTS!r} is the defaults' arm, not a lever name")
    if sc.servers < 1 or sc.defaults_every < 1:
        raise ConfigError("screen.servers and screen.defaults_every must be >= 1")
    if not chosen_levers(sc):
        raise ConfigError("the screen has no lever (screen.levers, screen.only)")
    if not needs_capacity(cfg.objective) or cfg.objective.objectives[0].metric not in METRICS:
        raise ConfigError(
            "mode=screen measures SLO capacity: its objective must start with capacity_rps "
            "(objective=capacity, which mode=screen selects) or capacity_per_gpu_rps "
            "(objective=capacity_per_gpu)"
        )


def real_weights_only(cfg: TunerConfig) -> list[str]:
    """On dummy weights, leave out the levers marked ``real_weights`` (speculative decoding) and
    log why; one named in ``screen.only`` is refused in one line instead. The names left out."""
    sc = cfg.screen
    if cfg.mode != "screen" or not cfg.model.dummy_weights:
        return []
    named = [n for n in sc.only if n in sc.levers and sc.levers[n].real_weights]
    if named:
        raise ConfigError(
            f"screen.only names {named}, which need the model's real weights (their gain is the "
            f"drafts' acceptance); model {cfg.model.name} has dummy weights (load_format dummy): "
            "use a model with real weights (e.g. model=smollm2-135m) or leave them out"
        )
    return disable_real_weights(sc.levers, "screen levers %s not screened", cfg.model)


def plan(levers: Sequence[str], need: Mapping[str, int], defaults_every: int) -> list[str]:
    """The arms to run, in order: round r holds every lever still needing an r-th server (every
    other round reversed, so drift does not favour the first levers), the defaults first, after
    every ``defaults_every`` lever servers, and last. Empty when no lever needs a server."""
    seq: list[str] = []
    for r in range(1, max(need.values(), default=0) + 1):
        names = [n for n in levers if need.get(n, 0) >= r]
        seq += names if r % 2 else names[::-1]
    if not seq:
        return []
    out = [DEFAULTS]
    for i, name in enumerate(seq, 1):
        out.append(name)
        if i % defaults_every == 0 or i == len(seq):
            out.append(DEFAULTS)
    return out


def prepare(study: optuna.Study, cfg: TunerConfig) -> TunerConfig:
    """Enqueue the servers the screen still needs (each lever ``screen.servers`` times, counting
    those run, running or waiting; an interrupted one again) and return ``cfg`` with
    ``study.n_trials`` the screen's waiting trials (no sampled trial: ``max_rejected`` 0) and
    each param the study has stored asked from its stored choices
    (:func:`tuner.screen_resume.stored_choices`).

    The servers a run before queued and did not run still run, those of levers this run's
    ``screen.only`` leaves out too (:func:`tuner.screen_resume.queued_levers`): the space covers
    their levers' params, and every waiting server asks each param of it at its arm's value
    (None, vLLM's default, for every param but its lever's): Optuna ignores a fixed param that
    is not in the space and samples a param of the space that a trial's fixed params do not
    name."""
    queued = screen_resume.queued_levers(study, cfg)
    cfg = screen_resume.covering(cfg, queued)
    cfg = screen_resume.stored_choices(study, cfg, queued)
    levers = chosen_levers(cfg.screen)
    live = study.get_trials(deepcopy=False, states=stored_trial.LIVE)
    have = Counter(stored_trial.screen_arm(t) for t in live)
    need = {n: cfg.screen.servers - have[n] for n in levers if have[n] < cfg.screen.servers}
    base = defaults(cfg.space)
    machine = screen_resume.here(cfg)
    arms = plan(list(levers), need, cfg.screen.defaults_every)
    ago = screen_resume.ended_on_defaults(study, machine, time.time())
    queue = screen_resume.waiting_servers(study)
    if arms and queue and stored_trial.screen_arm(queue[-1]) == DEFAULTS:
        arms = arms[1:]  # a second defaults' server right after it would measure nothing new
        log.info(
            "  a defaults' server queued by an earlier run waits last: the new servers start "
            "with a lever after it"
        )
    elif arms and ago is not None:
        arms = arms[1:]
        log.info(
            "  vLLM's defaults were the last server on this machine's GPUs, %.0f s ago: the "
            "new servers start with a lever",
            ago,
        )
    for arm in arms:
        params = dict(base)
        if arm != DEFAULTS:
            params[levers[arm].param] = levers[arm].value
        study.enqueue_trial(params, user_attrs=stored_trial.screen_attrs(arm, arm == DEFAULTS))
    store_screen(study, {n: _described(lever) for n, lever in levers.items()})
    moved = screen_resume.defaults_first(study, base, machine)
    if moved:
        log.info(
            "  vLLM's defaults have not run on this machine's GPUs yet: they run first, before "
            "the %d waiting lever server(s), so that each is compared with the defaults of its "
            "own machine",
            moved,
        )
    mine = screen_resume.waiting_servers(study)
    for t in mine:  # queued by a run whose space had other params: each of this one's named
        fixed = stored_trial.fixed_params(t)
        if any(name not in fixed for name in base):
            stored_trial.set_fixed_params(study, t, {**base, **fixed})
    if queued:
        log.info(
            "  the waiting servers of %s (queued before, not among this run's levers) run too",
            ", ".join(queued),
        )
    return replace(cfg, study=replace(cfg.study, n_trials=len(mine), max_rejected=0))


def round_end(study: optuna.Study, cfg: TunerConfig, elapsed: float) -> RoundEnd | None:
    """Before each ask of a run ``elapsed`` seconds in (:mod:`tuner.study`): under
    ``mode=screen``, where ``study.timeout_s`` likely fits one server more
    (:func:`tuner.screen_resume.last_to_start`), the run ends on vLLM's defaults
    (:func:`tuner.screen_resume.close_round`), and the log says how. None otherwise."""
    if cfg.mode != "screen":
        return None
    since = datetime.datetime.now() - datetime.timedelta(seconds=elapsed)
    durations = screen_resume.ended_since(study, since)
    if not screen_resume.last_to_start(cfg.study.timeout_s, elapsed, durations):
        return None
    end = screen_resume.close_round(study, defaults(cfg.space))
    if end == "defaults_next":
        log.info(
            "  study.timeout_s leaves time for one server more and the last one was a lever's: "
            "vLLM's defaults run next, so that this run ends on them (the levers still queued "
            "wait for the next run)"
        )
    elif end == "end":
        log.info(
            "  study.timeout_s leaves time for one server more and the last one was vLLM's "
            "defaults': no lever starts that no defaults' server would follow; the same command "
            "continues with the levers queued"
        )
    return end


def _described(lever: Any) -> dict[str, Any]:
    out = asdict(lever)
    out.pop("enabled", None)
    return out


@dataclass(frozen=True)
class LeverRow:
    """One lever of the screen against vLLM's defaults."""

    lever: str
    flag: str
    """The words it adds to ``vllm serve`` (``--kv-cache-dtype fp8``, ``--no-async-scheduling``)."""
    value: Any
    numerics: bool
    capacities: tuple[float, ...]
    """The lever's capacity (requests/s) per measured server."""
    base: tuple[float, ...]
    """The defaults' capacity per measured server (the same for every row)."""
    change: Gain
    word: str
    failures: tuple[str, ...] = ()
    """Each failed server's reason (``launch_failed``, ``interrupted``, ...)."""
    censored: bool = False
    """A server held at the capacity search's highest load: its capacity is a lower bound."""
    quality: dict[str, Any] | None = None
    """A lever that changes numerics: :func:`tuner.quality_guard.screen_quality`'s record (its
    servers' eval replays against the defaults'; ``dummy`` on random weights)."""
    acceptance: tuple[float, ...] = ()
    """Speculative decoding: each measured server's draft acceptance (accepted ÷ drafted tokens,
    ``spec_decode_acceptance`` from vLLM's ``/metrics``); empty for a lever that drafts none."""
    follow_up: bool = False
    """Its point change is at least ``screen.follow_up``, measured on fewer than
    :data:`FOLLOW_UP_SERVERS` servers (or ``screen.servers`` where more are asked): worth the
    follow-up."""
    machines: int = 1
    """How many machines the screen's measured servers ran on (:func:`tuner.stored_trial.machine`;
    trials without a record count as one): on more than one, each lever server is compared with
    the defaults of its own machine (:func:`change`)."""
    metric: str = METRIC
    """What ``capacities``, ``base`` and ``change`` are (:data:`METRICS`): requests/s, or
    requests/s per GPU in a layout screen."""
    server_rps: tuple[float, ...] = ()
    """In a screen per GPU: each measured server's capacity in requests/s, whatever its GPUs
    (``capacities`` are per GPU); empty otherwise."""

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["change"] = asdict(self.change)
        return out


Measured = Sequence[tuple[str | None, float]]
"""Capacities, each with the machine that measured it (:func:`tuner.stored_trial.machine`)."""


def change(
    values: Sequence[float] | Measured, base: Sequence[float] | Measured, floor: float
) -> Gain:
    """The lever's capacity change over the defaults. Where the lever's and the defaults'
    servers ran on more than one machine (values given as ``(machine, capacity)``), each lever
    server against the defaults of its machine (:func:`tuner.verdict.gain_in_blocks`). On one
    machine: with 2 servers or more on each side, :func:`tuner.verdict.gain` (Welch's t on the
    log values, the confirm stage's rule); with one lever server,
    :func:`tuner.verdict.gain_of_one` (the interval from the defaults' spread, at least
    ``floor``)."""
    pick, ref = _measured(values), _measured(base)
    if len({m for m, _ in [*pick, *ref]}) > 1:
        return gain_in_blocks(pick, ref, higher=True, floor=floor)
    caps, base_caps = [c for _, c in pick], [c for _, c in ref]
    if len(caps) == 1:
        return gain_of_one(caps[0], base_caps, higher=True, floor=floor)
    return gain(caps, base_caps, higher=True)


def _measured(values: Sequence[float] | Measured) -> list[tuple[str | None, float]]:
    return [v if isinstance(v, tuple) else (None, float(v)) for v in values]


def word(g: Gain, failed: bool = False, zero: bool = False) -> str:
    """``gain`` (the interval above 0), ``loss`` (below 0, or ``zero``: the lever held the SLOs
    at no load tried), ``no significant change`` (the interval holds 0), ``no interval``,
    ``failed`` (no server measured it). (A lever with no server run yet is ``not run yet``:
    :func:`rows`.)"""
    if failed:
        return "failed"
    if zero:
        return "loss"
    if g.low is None or g.high is None:
        return "no interval"
    if g.low > 0:
        return "gain"
    if g.high < 0:
        return "loss"
    return "no significant change"


def bracket_floor(rel_width: float) -> float:
    """The least spread between servers a screen's interval assumes: a capacity is known within
    its bracket (``objective.capacity.rel_width``), a uniform error of sd
    ``log(1 + rel_width) / √12`` on the log scale."""
    return math.log1p(rel_width) / math.sqrt(12)


def screen_metric(study: optuna.Study, cfg: TunerConfig) -> str:
    """What the screen compares (:data:`METRICS`): the first objective the study was measured
    with (a report that opens it by ``study.name`` reads it the same), else ``cfg``'s."""
    stored = objective_names(study)
    first = stored[0].split(":")[0] if stored else cfg.objective.objectives[0].metric
    return first if first in METRICS else METRIC


def rows(study: optuna.Study, cfg: TunerConfig) -> list[LeverRow]:
    """The screen's table from the stored trials: one row per lever the study has enqueued
    (:func:`tuner.stored_study.screen_levers`), in the order of ``screen.levers``. The floor of
    the one-server interval is the capacity search's resolution: a capacity is known within its
    bracket (``objective.capacity.rel_width`` as the study stored it, else ``cfg``'s), a uniform
    error of sd ``log(1 + rel_width) / √12``."""
    described = screen_levers(study) or {
        name: _described(lever) for name, lever in chosen_levers(cfg.screen).items()
    }
    metric = screen_metric(study, cfg)
    order = [n for n in cfg.screen.levers if n in described]
    order += [n for n in described if n not in order]
    by_arm: dict[str, list[optuna.trial.FrozenTrial]] = {}
    for t in study.get_trials(deepcopy=False):
        arm = stored_trial.screen_arm(t)
        if arm is not None and t.state != optuna.trial.TrialState.WAITING:
            by_arm.setdefault(arm, []).append(t)
    measured = [
        (stored_trial.machine(t), c)
        for t in by_arm.get(DEFAULTS, [])
        if (c := capacity_of(t, metric)) is not None
    ]
    base = tuple(c for _, c in measured)
    machines = {
        stored_trial.machine(t)
        for trials in by_arm.values()
        for t in trials
        if capacity_of(t, metric) is not None
    }
    rel_width = stored_rel_width(study)
    if rel_width is None:
        rel_width = cfg.objective.capacity.rel_width
    floor = bracket_floor(rel_width)
    out = []
    for name in order:
        d = described[name]
        trials = by_arm.get(name, [])
        done = [(t, c) for t in trials if (c := capacity_of(t, metric)) is not None]
        mine = [(stored_trial.machine(t), c) for t, c in done]
        caps = tuple(c for _, c in mine)
        measured_here = {t.number for t, _ in done}
        failures = tuple(
            stored_trial.failure_reason(t) or t.state.name.lower()
            for t in trials
            if t.number not in measured_here
        )
        g = (
            change(mine, measured, floor)
            if caps
            else Gain(None, n_base=len(base), why="no server measured it")
        )
        acceptance = tuple(
            a
            for t, _ in done
            if (a := stored_trial.metric(t, "spec_decode_acceptance")) is not None
        )
        censored = any((stored_trial.metric(t, "capacity_censored") or 0) > 0 for t in trials)
        flag = d.get("flag") or "--" + str(d["param"]).replace("_", "-")
        numerics = numerics_changes({str(d["param"]): d["value"]})
        changes = [f"{k}={v}" for k, v in numerics.items()]
        defaults_run = by_arm.get(DEFAULTS, [])
        quality = screen_quality(cfg, changes, trials, defaults_run) if numerics and caps else None
        out.append(
            LeverRow(
                name,
                " ".join(flag_args(flag, d["value"])),
                d["value"],
                bool(numerics),
                caps,
                base,
                g,
                (
                    word(g, failed=not caps and bool(failures), zero=bool(caps) and max(caps) <= 0)
                    if trials
                    else "not run yet"
                ),
                failures,
                censored,
                quality,
                acceptance,
                g.value is not None
                and g.value >= cfg.screen.follow_up
                and len(caps) < max(FOLLOW_UP_SERVERS, cfg.screen.servers),
                len(machines) or 1,
                metric,
                ()
                if metric == METRIC
                else tuple(r for t, _ in done if (r := stored_trial.metric(t, METRIC)) is not None),
            )
        )
    return out
