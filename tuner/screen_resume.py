"""A lever screen continued from its stored study (:func:`tuner.screen.prepare`): the servers an
earlier run queued and did not run (:func:`queued_levers`, :func:`covering`), the choices the
study stored for each flag (:func:`stored_choices`: Optuna keeps a categorical's choices for a
study's life), and the machine it goes on on (:func:`here`; :func:`ended_on_defaults`,
:func:`defaults_first`: each lever is compared with the defaults of its own machine); a run whose
time ends closes on the defaults (:func:`close_round`)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

import optuna
from optuna.distributions import CategoricalDistribution

from tuner import stored_trial
from tuner.config import LeverSpec, TunerConfig, chosen_levers, screen_space
from tuner.errors import ConfigError, EngineError
from tuner.space import override_value
from tuner.stored_study import screen_levers, stored_distributions
from tuner.telemetry.gpu import gpu_memory, machine_of, nvml_available

__all__ = [
    "DEFAULTS",
    "METRIC",
    "RoundEnd",
    "SAME_RUN_S",
    "capacity_of",
    "close_round",
    "covering",
    "defaults_first",
    "ended_on_defaults",
    "ended_since",
    "here",
    "last_to_start",
    "queued_levers",
    "stored_choices",
    "waiting_servers",
]

DEFAULTS = "defaults"
"""The arm of vLLM's defaults (no flag passed)."""
METRIC = "capacity_rps"


def waiting_servers(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The screen's servers queued and not run yet (WAITING trials with an arm), in run order."""
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    return [t for t in waiting if stored_trial.screen_arm(t) is not None]


def capacity_of(t: optuna.trial.FrozenTrial, metric: str = METRIC) -> float | None:
    """A screen server's measured ``metric``; None where it failed or did not complete."""
    if t.state != optuna.trial.TrialState.COMPLETE or stored_trial.failure_reason(t):
        return None
    return stored_trial.metric(t, metric)


def queued_levers(study: optuna.Study, cfg: TunerConfig) -> dict[str, LeverSpec]:
    """The levers of the screen's WAITING servers (queued by a run before, not run yet) that
    ``screen.only`` leaves out, from ``screen.levers``. A ConfigError (one line) where such a
    lever is no longer in ``screen.levers``, or a waiting server of any lever was queued with
    another value than ``screen.levers`` gives it now: it would run unlabelled or mislabelled."""
    chosen = chosen_levers(cfg.screen)
    described = screen_levers(study) or {}
    out: dict[str, LeverSpec] = {}
    for t in waiting_servers(study):
        arm = stored_trial.screen_arm(t)
        if arm is None or arm == DEFAULTS:  # (None: for the type checker only)
            continue
        lever = cfg.screen.levers.get(arm)
        if lever is None:
            d = described.get(arm, {})
            back = ""
            if "param" in d and "value" in d:
                value = override_value(d["value"])
                back = f" (+screen.levers.{arm}={{param:{d['param']},value:{value}}})"
            raise ConfigError(
                f"study {study.study_name!r} has waiting servers of lever {arm}, which "
                f"screen.levers no longer has: put it back in screen.levers{back} to run them, "
                "or screen under another study.name"
            )
        fixed = stored_trial.fixed_params(t)
        if lever.param in fixed and fixed[lever.param] != lever.value:
            was = fixed[lever.param]
            raise ConfigError(
                f"study {study.study_name!r} has a waiting server of lever {arm} (trial "
                f"{t.number}) queued with {lever.param}={was!r}; screen.levers.{arm} now sets "
                f"{lever.value!r}: set screen.levers.{arm}.value back to {override_value(was)} "
                "to run it, or screen under another study.name"
            )
        if arm not in chosen:
            out.setdefault(arm, lever)
    return out


def covering(cfg: TunerConfig, levers: Mapping[str, LeverSpec]) -> TunerConfig:
    """``cfg`` whose screen space also holds the params of ``levers`` (each with its lever's
    value among its choices, as :func:`tuner.config.screen_space` makes them)."""
    if not levers:
        return cfg
    more = screen_space(replace(cfg.screen, only=list(levers))).params
    params = dict(cfg.space.params)
    for name, spec in more.items():
        have = params.get(name)
        if have is None:
            params[name] = spec
            continue
        missing = [c for c in spec.choices or [] if c not in (have.choices or [])]
        if missing:
            params[name] = replace(have, choices=[*(have.choices or []), *missing])
    return replace(cfg, space=replace(cfg.space, params=params))


def stored_choices(
    study: optuna.Study, cfg: TunerConfig, queued: Mapping[str, LeverSpec] | None = None
) -> TunerConfig:
    """``cfg`` with each screen param that ``study`` has stored asked from the stored choices
    (the same order): Optuna keeps a categorical's choices for a study's life, and a screen
    stored before :func:`tuner.config.screen_space` took every lever's value has narrower ones
    (``cudagraph_mode``: ``[None, 'PIECEWISE']``). A ConfigError (one line) when they lack a
    value this run needs (its levers' and those of ``queued``, the waiting servers'
    :func:`queued_levers`): Optuna would refuse the ask."""
    stored = stored_distributions(study)
    chosen = {**chosen_levers(cfg.screen), **(queued or {})}
    params = dict(cfg.space.params)
    for name, spec in cfg.space.params.items():
        if name not in stored:
            continue
        dist = stored[name]
        have = list(dist.choices) if isinstance(dist, CategoricalDistribution) else None
        levers = [n for n, lever in chosen.items() if lever.param == name]
        lacking = [n for n in levers if have is None or chosen[n].value not in have]
        if have is None or lacking or None not in have:
            what = ", ".join(
                f"{n} ({chosen[n].value!r}{', queued before' if n in (queued or {}) else ''})"
                for n in lacking
            )
            names = lacking or levers
            raise ConfigError(
                f"study {study.study_name!r} stores {name} "
                f"{f'as {dist}' if have is None else f'with choices {have}'}, and Optuna keeps "
                f"a categorical's choices for a study's life: {what or 'the defaults (None)'} "
                f"cannot run in it; screen {', '.join(names)} in a study of its own, under "
                f"another study.name (e.g. study.name={study.study_name}-{'-'.join(names)})"
            )
        params[name] = replace(spec, choices=have)
    return replace(cfg, space=replace(cfg.space, params=params))


def here(cfg: TunerConfig) -> str | None:
    """This run's GPUs as a trial records its machine (:func:`tuner.telemetry.gpu.machine_of`);
    None for the simulator or without NVML."""
    if cfg.engine.kind != "vllm" or not nvml_available():
        return None
    try:
        return machine_of(gpu_memory(cfg.engine.gpus))
    except EngineError:
        return None


SAME_RUN_S = 1800
"""A defaults' server that ended this recently on the same GPUs opens the next servers as if
it were theirs: one machine hold on the device (30 minutes)."""


def ended_on_defaults(study: optuna.Study, machine: str | None, now: float) -> float | None:
    """Whether the screen, continued with more levers (:func:`tuner.screen.prepare`), may leave
    out the new servers' leading defaults: nothing waits or runs, and its last server to end is
    a measured defaults' server on these GPUs (``machine``; never on the simulator, None) that
    ended less than :data:`SAME_RUN_S` before ``now`` (seconds since the epoch); then how long
    ago, else None. Those defaults stand before the new levers as the run's first would. On
    2026-12-06 a screen ended D qk D, and the same command with one lever more ran another
    defaults' server a minute later on the same H100 (docs/gpu-runs/2026-12-06-levers-h100.md)."""
    if machine is None:
        return None
    busy = (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING)
    if any(stored_trial.screen_arm(t) is not None for t in study.get_trials(states=busy)):
        return None
    last = _last_ended(study)
    if last is None or last.datetime_complete is None:
        return None
    ago = now - last.datetime_complete.timestamp()
    if (
        last.state != optuna.trial.TrialState.COMPLETE
        or stored_trial.screen_arm(last) != DEFAULTS
        or capacity_of(last) is None
        or not _same_gpus(machine, stored_trial.machine(last))
        or ago >= SAME_RUN_S
    ):
        return None
    return ago


def _last_ended(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The study's trial that ended last; None before any ended."""
    done = [
        (t.datetime_complete, t)
        for t in study.get_trials(deepcopy=False)
        if t.datetime_complete is not None
    ]
    return max(done, key=lambda p: p[0])[1] if done else None


def _same_gpus(machine: str, ran: str | None) -> bool:
    """Whether a trial that ran on ``ran`` (:func:`tuner.stored_trial.machine`; None: not
    recorded) shares a GPU with ``machine``."""
    return bool(ran) and bool(set(machine.split(",")) & set(str(ran).split(",")))


def defaults_first(study: optuna.Study, params: dict[str, Any], machine: str | None) -> int:
    """A screen continued on a machine (``machine``: its GPUs' UUIDs) where none of its
    defaults' servers was measured (one stored without its machine counts as another
    machine's), whose next waiting server is a lever: the waiting servers
    move one place down and vLLM's defaults (``params``) take the first (one server more). A
    lever run there is then compared with defaults run there even if the machine goes before
    the queue's later defaults (:func:`tuner.screen.change`); on 2026-12-05 a continued screen
    ran three levers on a new H100 before its first defaults' server. Returns how many waiting lever
    servers now follow the defaults (0: nothing moved)."""
    waiting = waiting_servers(study)
    if machine is None or not waiting or stored_trial.screen_arm(waiting[0]) == DEFAULTS:
        return 0
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if (
            stored_trial.screen_arm(t) == DEFAULTS
            and capacity_of(t) is not None
            and _same_gpus(machine, stored_trial.machine(t))
        ):
            return 0
    queue = _queue(waiting)
    _put_first(study, waiting, queue, (DEFAULTS, True, dict(params)))
    return sum(a != DEFAULTS for a, _, _ in queue)


_Entry = tuple[str, bool, dict[str, Any]]
"""A waiting screen server: its arm, whether it is a baseline, its fixed params."""


def _queue(waiting: list[optuna.trial.FrozenTrial]) -> list[_Entry]:
    return [
        (
            stored_trial.screen_arm(t) or DEFAULTS,
            stored_trial.is_baseline(t),
            stored_trial.fixed_params(t),
        )
        for t in waiting
    ]


def _put_first(
    study: optuna.Study,
    waiting: list[optuna.trial.FrozenTrial],
    queue: list[_Entry],
    first: _Entry,
) -> None:
    """``first`` runs next and the waiting servers one place later each (one server more):
    Optuna runs waiting trials in their order, so the last one is enqueued again at the end and
    each trial takes the entry before it."""
    arm, baseline, last = queue[-1]
    study.enqueue_trial(last, user_attrs=stored_trial.screen_attrs(arm, baseline))
    for t, (arm, baseline, fixed) in zip(waiting[1:], queue[:-1], strict=True):
        stored_trial.requeue_screen(study, t, arm, baseline, fixed)
    stored_trial.requeue_screen(study, waiting[0], *first)


RoundEnd = Literal["defaults_next", "end"]
"""How a screen's round whose time fits one server more ends (:func:`close_round`)."""


def close_round(study: optuna.Study, params: dict[str, Any]) -> RoundEnd | None:
    """A screen's run whose time fits one server more: it ends on vLLM's defaults. Where the
    last server to end was a lever's and a lever waits next, a defaults' server (``params``) is
    added before the waiting ones (one server more, so that the queue the next run continues
    keeps its own closing defaults): ``"defaults_next"``. Where the last server to end was the
    defaults' and a lever waits next, that lever would end the run without defaults after it:
    ``"end"``, the run starts no more servers. None where nothing waits, the defaults are next
    anyway, or no server has ended. On 2026-12-07 a continued screen's time ended after D P B,
    and a call of its own had to run the closing defaults
    (docs/gpu-runs/2026-12-07-levers-chat-h100.md)."""
    waiting = waiting_servers(study)
    if not waiting or stored_trial.screen_arm(waiting[0]) == DEFAULTS:
        return None
    last = _last_ended(study)  # a screen's servers all have an arm (prepare enqueues them)
    if last is None:
        return None
    if stored_trial.screen_arm(last) == DEFAULTS:
        return "end"
    _put_first(study, waiting, _queue(waiting), (DEFAULTS, True, dict(params)))
    return "defaults_next"


def last_to_start(budget: float | None, elapsed: float, durations: list[float]) -> bool:
    """Whether the server about to be asked for is likely the run's last: ``study.timeout_s``
    (``budget``) will have passed when it ends, going by the mean wall time of the run's servers
    that ended so far (``durations``; one at a time, as a screen runs). False without a budget
    or an ended server."""
    if budget is None or not durations:
        return False
    return elapsed + sum(durations) / len(durations) >= budget


def ended_since(study: optuna.Study, since: datetime.datetime) -> list[float]:
    """The wall times of the trials that started at ``since`` (naive local time, as Optuna
    stores it) or later and have ended: told, as the asking loop resumes before a trial's
    tracking is done."""
    return [
        (t.datetime_complete - t.datetime_start).total_seconds()
        for t in study.get_trials(deepcopy=False)
        if t.datetime_start is not None
        and t.datetime_complete is not None
        and t.datetime_start >= since
    ]
