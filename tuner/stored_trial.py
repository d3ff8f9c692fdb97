"""The stored trial: the one place that writes and reads what a trial leaves in Optuna storage.

A study's trials are read back by the confirm stage, the report, the figures, crash recovery,
notebooks and scripts, often from another process or another host. Every key a trial stores is
written here (:func:`tell`, :func:`mark_worker`, ...) and every question asked of a stored trial
is answered here (:func:`feasible`, :func:`is_baseline`, :func:`counted`, :func:`trial_dir`, ...),
so a key is spelled once.

What a told trial holds:

- **state**: COMPLETE when it was measured *or* failed (a failure is data: its constraint
  ``failed_<reason>`` is 1 and its values are the penalty values); PRUNED when its replay was
  stopped early; FAIL only when it was interrupted (``failure_reason`` ``interrupted``, see
  :func:`mark_interrupted`) or hit a bug in the tuner (``tuner_error``).
- **constraints** (> 0 = violated): ``error_rate``, ``slo_*`` and ``failed_<reason>``, stored
  where all of Optuna's own tools read them: the values as the list in the system attribute
  ``constraints`` (what a sampler's ``constraints_func`` stores; Optuna's samplers, its plots
  such as ``plot_pareto_front`` and ``study.best_trials`` read it as ``trial.constraints``, and
  optuna-dashboard reads only this list), their names in the user attribute ``constraint_names``.
  Optuna's per-name keys (``Trial.set_constraint``) are not used: optuna-dashboard does not read
  them (it showed every failed config as a feasible trial at the penalty values), and both forms
  at once would count each constraint twice. Read them with :func:`constraints`, which also reads
  the per-name keys of a trial stored before.
- **user attributes**: ``constraint_names``, ``metrics`` (every metric of :mod:`tuner.score`
  and telemetry), ``failure_reason`` / ``failure_detail``, ``predicted_kv_tokens``, ``launched``,
  ``server_s``, ``pruned``, ``gpus``, ``argv`` (masked), ``serve_args`` (argv after the engine
  command), ``trial_dir``, ``machine`` (the leased GPUs' NVML UUIDs; absent without NVML), and
  after a launch ``kv_cache_tokens``, ``startup_s``,
  ``engine_version``, and ``changes_numerics`` (the searched params that can change the model's
  numerics, :func:`tuner.space.numerics_params`, as ``name=value``; absent when none); set
  when it was asked or enqueued: ``worker`` (``host:pid``), ``baseline`` (vLLM's defaults),
  ``prescreen`` (the simulator's prediction), ``screen_arm`` (the lever screen's arm: a
  lever's name, or ``defaults``), and ``tuner_error`` on a tuner bug.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna

from tuner import records
from tuner.config import TunerConfig
from tuner.engine.argv import command_prefix
from tuner.errors import INTERRUPTED
from tuner.records import TrialResult
from tuner.score import failure_values
from tuner.space import numerics_params

__all__ = [
    "BASELINE",
    "changes_numerics",
    "numerics_of",
    "CONSTRAINTS",
    "CONSTRAINT_NAMES",
    "LIVE",
    "constraint_attrs",
    "constraints",
    "counted",
    "failure_reason",
    "feasible",
    "fixed_params",
    "gpu_count",
    "is_baseline",
    "machine",
    "mark_interrupted",
    "mark_tuner_error",
    "mark_worker",
    "measured",
    "screen_arm",
    "screen_attrs",
    "metric",
    "metrics",
    "prescreen_attrs",
    "rejected_before_launch",
    "requeue_screen",
    "serve_args",
    "server_s",
    "set_fixed_params",
    "tell",
    "trial_dir",
    "tuner_error",
    "violated",
    "worker",
]

BASELINE = {"baseline": True}
"""The user attributes of the enqueued baseline trial (vLLM's defaults)."""

LIVE = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.WAITING,
)
"""States of a trial that has run, runs or will run; a FAIL (interrupted, tuner bug) has not."""

CONSTRAINTS = "constraints"
"""The system attribute of a trial's constraint values, a list: where a sampler's
``constraints_func`` stores them, and the only place optuna-dashboard reads them."""

CONSTRAINT_NAMES = "constraint_names"
"""The user attribute naming the values of :data:`CONSTRAINTS`, in their order."""

Stored = optuna.trial.FrozenTrial | optuna.Trial


_NUMERICS = "changes_numerics"
_MACHINE = "machine"
_FIXED_PARAMS = "fixed_params"


# --- writing ------------------------------------------------------------------------------------


def tell(
    study: optuna.Study, trial: optuna.Trial, result: TrialResult, cfg: TunerConfig, tdir: Path
) -> None:
    """Store ``result`` on ``trial`` (run in folder ``tdir``) and tell Optuna its state."""
    system, user = constraint_attrs(result.constraints)
    for key, value in system.items():  # Optuna has no public setter for a system attribute
        trial.storage.set_trial_system_attr(trial._trial_id, key, value)
    attrs: dict[str, Any] = {
        **user,
        "metrics": result.metrics,
        "failure_reason": result.failure_reason,
        "failure_detail": result.failure_detail,
        "predicted_kv_tokens": result.predicted_kv_tokens,
        "launched": result.launched,
        "server_s": result.server_s,
        "pruned": result.pruned,
        "gpus": list(result.gpus),
        "argv": list(result.argv),
        "serve_args": list(result.argv[len(command_prefix(cfg.engine)) :]),
        "trial_dir": str(tdir.resolve()),
    }
    if result.machine is not None:
        attrs[_MACHINE] = result.machine
    numerics = numerics_of(cfg, result)
    if numerics:
        attrs[_NUMERICS] = numerics
    if result.launch is not None:
        attrs["kv_cache_tokens"] = result.launch.facts.kv_cache_tokens
        attrs["startup_s"] = result.launch.startup_s
        attrs["engine_version"] = result.launch.facts.engine_version
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    if result.pruned:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return
    values = result.values if result.values is not None else failure_values(cfg.objective)
    study.tell(trial, list(values))


_SCREEN_ARM = "screen_arm"


def screen_attrs(arm: str, baseline: bool) -> dict[str, Any]:
    """The user attributes of an enqueued screen trial: its arm (and :data:`BASELINE` for the
    defaults)."""
    return {_SCREEN_ARM: arm, **(BASELINE if baseline else {})}


def constraint_attrs(values: Mapping[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The system attributes and the user attributes that store the constraints ``values``
    (:data:`CONSTRAINTS`, :data:`CONSTRAINT_NAMES`)."""
    names = list(values)
    return {CONSTRAINTS: [float(values[n]) for n in names]}, {CONSTRAINT_NAMES: names}


def requeue_screen(
    study: optuna.Study,
    t: optuna.trial.FrozenTrial,
    arm: str,
    baseline: bool,
    params: dict[str, Any],
) -> None:
    """Give the WAITING screen trial ``t`` another arm: its fixed params (Optuna's
    ``fixed_params``, what :meth:`optuna.Study.enqueue_trial` stored), :data:`_SCREEN_ARM` and
    ``baseline``. Optuna runs waiting trials in their order, so this is how a queue is
    reordered (:func:`tuner.screen.prepare`)."""
    set_fixed_params(study, t, params)
    storage = study._storage  # noqa: SLF001  # Optuna has no public setter for a user attribute
    storage.set_trial_user_attr(t._trial_id, _SCREEN_ARM, arm)  # noqa: SLF001
    storage.set_trial_user_attr(t._trial_id, "baseline", baseline)  # noqa: SLF001


def fixed_params(t: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The params a WAITING trial was enqueued with (Optuna's ``fixed_params``; empty if none):
    Optuna asks each param of the space it names at that value, and samples the others."""
    return dict(t.system_attrs.get(_FIXED_PARAMS) or {})


def set_fixed_params(
    study: optuna.Study, t: optuna.trial.FrozenTrial, params: dict[str, Any]
) -> None:
    """Replace the fixed params of the WAITING trial ``t`` (:func:`fixed_params`)."""
    storage = study._storage  # noqa: SLF001  # Optuna has no public setter for a system attribute
    storage.set_trial_system_attr(t._trial_id, _FIXED_PARAMS, params)  # noqa: SLF001


def mark_worker(trial: optuna.Trial, worker_id: str) -> None:
    """The tuner process (``host:pid``) that runs ``trial``: crash recovery reads it."""
    trial.set_user_attr("worker", worker_id)


def mark_interrupted(study: optuna.Study, t: Stored, detail: str) -> None:
    """A RUNNING trial that will not end (its tuner was stopped, or died): ``failure_reason``
    ``interrupted`` and ``failure_detail`` saying how, then told FAIL. ``t`` is the live trial
    (Ctrl-C) or one read back from storage (the next run's crash recovery)."""
    attrs = {"failure_reason": INTERRUPTED, "failure_detail": detail}
    if isinstance(t, optuna.Trial):
        for k, v in attrs.items():
            t.set_user_attr(k, v)
    else:  # Optuna has no public API for the attrs of a RUNNING trial read back from storage
        storage = study._storage  # noqa: SLF001
        for k, v in attrs.items():
            storage.set_trial_user_attr(t._trial_id, k, v)  # noqa: SLF001
    study.tell(t.number, state=optuna.trial.TrialState.FAIL)


def mark_tuner_error(trial: optuna.Trial, exc: BaseException) -> None:
    trial.set_user_attr("tuner_error", repr(exc)[:1000])


def prescreen_attrs(predicted: dict[str, Any]) -> dict[str, Any]:
    """The user attributes of a trial the prescreen enqueued, with the simulator's prediction."""
    return {"prescreen": predicted}


# --- reading ------------------------------------------------------------------------------------


def is_baseline(t: Stored) -> bool:
    """The trial runs vLLM's defaults (no searched flag passed)."""
    return bool(t.user_attrs.get("baseline", False))


def screen_arm(t: Stored) -> str | None:
    """The lever screen's arm this trial measured (a lever's name, or ``defaults``); None outside
    a screen."""
    arm = t.user_attrs.get(_SCREEN_ARM)
    return None if arm is None else str(arm)


def failure_reason(t: Stored) -> str | None:
    """Why a COMPLETE trial could not be measured (a :class:`tuner.errors.FailureReason`
    value), or None; a FAIL trial's is ``interrupted`` (:func:`mark_interrupted`), or none after
    a bug in the tuner (:func:`tuner_error`)."""
    return t.user_attrs.get("failure_reason") or None


def tuner_error(t: Stored) -> str | None:
    return t.user_attrs.get("tuner_error") or None


def measured(t: optuna.trial.FrozenTrial) -> bool:
    """COMPLETE with real values: not the penalty values of a failed trial, feasible or not."""
    return (
        t.state == optuna.trial.TrialState.COMPLETE
        and t.values is not None
        and failure_reason(t) is None
    )


def constraints(t: Stored) -> dict[str, float]:
    """The trial's constraints by name (> 0 = violated); empty for a trial not told (FAIL,
    RUNNING). A trial stored with Optuna's per-name keys (before :data:`CONSTRAINT_NAMES`) is
    read by those names."""
    values = t.constraints  # Optuna's reading: the list's as "0", "1", ..., per-name keys by name
    names = t.user_attrs.get(CONSTRAINT_NAMES)
    if not names:
        return dict(values)
    return {name: values[str(i)] for i, name in enumerate(names) if str(i) in values}


def violated(t: Stored) -> list[str]:
    """The names of the constraints the trial violates, sorted."""
    return sorted(k for k, v in constraints(t).items() if v > 0)


def feasible(t: optuna.trial.FrozenTrial) -> bool:
    """Measured, and within every constraint (error budget and SLOs)."""
    return measured(t) and bool(constraints(t)) and not violated(t)


def rejected_before_launch(t: Stored) -> bool:
    """Refused before any GPU was leased (the precheck, or a lease limit): no GPU time spent
    (:func:`tuner.records.rejected_before_launch` on its attributes)."""
    a = t.user_attrs
    return records.rejected_before_launch(failure_reason(t), a.get("launched"), a.get("gpus"))


def counted(t: Stored) -> bool:
    """Counts toward ``study.n_trials``: all but the configs refused before launch (which are
    free up to ``study.max_rejected`` a run, past which they count: the study's log says)."""
    return not rejected_before_launch(t)


def metrics(t: Stored) -> dict[str, float]:
    return dict(t.user_attrs.get("metrics") or {})


def metric(t: Stored, name: str) -> float | None:
    v = (t.user_attrs.get("metrics") or {}).get(name)
    return float(v) if isinstance(v, int | float) else None


def server_s(t: Stored) -> float:
    """The seconds the trial held a server, from launch to the end of its stop: start-up, every
    replay, the stop, and a launch retried after a port clash (on the simulator: simulated GPU
    time); 0 for a config refused before launch."""
    return float(t.user_attrs.get("server_s") or 0.0)


def serve_args(t: Stored) -> tuple[str, ...]:
    """The ``vllm serve`` arguments the trial was launched with (after the engine command)."""
    return tuple(t.user_attrs.get("serve_args") or ())


def trial_dir(t: Stored, *, here: bool = True) -> Path | None:
    """The trial's folder, if it was recorded and (``here``) is on this machine; ``here=False``:
    the path as recorded, e.g. to find the folder copied elsewhere."""
    d = t.user_attrs.get("trial_dir")
    return Path(d) if d and (not here or Path(d).is_dir()) else None


def gpu_count(t: Stored) -> int | None:
    """How many GPUs the trial's server leased (the ``gpus`` it ran on, as :func:`tell` stores
    them; ``capacity_per_gpu_rps`` divides by this), or None when none were recorded."""
    return len(t.user_attrs.get("gpus") or ()) or None


def worker(t: Stored) -> str:
    return str(t.user_attrs.get("worker", ""))


def machine(t: Stored) -> str | None:
    """Which GPUs measured the trial (their NVML UUIDs), or None where it was not recorded (the
    simulator, a trial stored before 2026-12-06): such trials count as one machine."""
    m = t.user_attrs.get(_MACHINE)
    return None if m is None else str(m)


def numerics_of(cfg: TunerConfig, result: TrialResult) -> list[str]:
    """The searched params of ``result`` that change the model's numerics, ``name=value`` each
    (none for vLLM's defaults): what :func:`tell` stores as ``changes_numerics`` and the trial's
    MLflow run is tagged with."""
    if result.baseline:
        return []
    return [f"{k}={v}" for k, v in numerics_params(cfg.space, result.params).items()]


def changes_numerics(t: Stored) -> list[str]:
    """The trial's searched params that can change the model's numerics, ``name=value`` each
    (:func:`tell`); empty for one that changes none, or stored before this was kept."""
    return [str(x) for x in t.user_attrs.get(_NUMERICS) or ()]
