"""The study in Optuna storage: its name, opening it (with its sampler), and its queue.

A study is named ``<workload>-<model>-<engine kind>`` unless ``study.name`` is set, and lives in
``study.storage`` (SQLite under ``paths.state_dir`` by default, or PostgreSQL shared by several
tuners). It records the engine kind it is measured on, and no run on another engine continues it:
simulated and real measurements never share a study. Before the search asks the sampler,
:func:`fill_queue` enqueues, each once: the baseline (vLLM's defaults, trial 0 of a new study),
``study.warm_start`` (another study's Pareto-best), ``study.enqueue`` and the prescreen's picks.
What a trial stores is :mod:`tuner.stored_trial`, what the study stores :mod:`tuner.stored_study`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import optuna
import yaml

from tuner import stored_trial
from tuner.capacity import Start
from tuner.compile_cache import warm_first
from tuner.config import ObjectiveConfig, TunerConfig
from tuner.config.compose import available, conf_dir
from tuner.confirm import median_crossing
from tuner.engine.argv import cache_root, params_key
from tuner.errors import ConfigError, StorageError
from tuner.grid import GridSampler, interrupted_cells
from tuner.memory import ModelShape
from tuner.prescreen import predict_start, prescreen
from tuner.records import RequestSpec
from tuner.recovery import worker_id
from tuner.score import capacity_metric, needs_capacity
from tuner.space import defaults, defaults_outside, grid
from tuner.stored_study import (
    baseline_trial,
    check_space,
    engine_kind,
    incumbent_capacity,
    objective_names,
    objective_of,
    prescreen_summary,
    store_names,
    store_prescreen,
)
from tuner.stored_trial import BASELINE, LIVE, is_baseline, prescreen_attrs
from tuner.stores import check_database, hide_url, mask_credentials

__all__ = [
    "check_enqueue",
    "enqueue_once",
    "fill_queue",
    "open_study",
    "retry_schema_race",
    "sampler_seed",
    "mark_baseline",
    "search_start",
    "trial_start",
    "storage_url",
    "check_objective",
    "objective_label",
    "study_name",
]

log = logging.getLogger("tuner")

Distributions = dict[str, optuna.distributions.BaseDistribution]
T = TypeVar("T")


def study_name(cfg: TunerConfig) -> str:
    """``study.name``, else ``<workload>-<model>-<engine kind>``, then ``-<objective>`` unless
    the objective is throughput against TTFT (:func:`objective_label`), then ``-screen`` for a
    lever screen (``mode=screen``): the same command continues the same study, and the
    simulator's and vLLM's measurements, each objective's and the screen's, go to studies of
    their own."""
    if cfg.study.name:
        return cfg.study.name
    label = objective_label(cfg.objective)
    return (
        f"{cfg.workload.name}-{cfg.model.name}-{cfg.engine.kind}"
        + (f"-{label}" if label else "")
        + ("-screen" if cfg.mode == "screen" else "")
    )


_SHORT = {"capacity_rps": "capacity", "capacity_per_gpu_rps": "capacity_per_gpu"}

BARE = (("output_throughput", "maximize"), ("ttft_p95_ms", "minimize"))
"""The objective whose studies carry no label (``objective=throughput``, the tuner's default
until SLO capacity took its place): its studies, and the capacity studies named
``...-capacity``, keep the names they were stored under, so the same command continues them."""


def objective_label(objective: ObjectiveConfig) -> str:
    """``""`` for :data:`BARE` (throughput against TTFT); else the metrics the objective has
    that it has not (``capacity_rps`` as ``capacity``), joined by ``-`` (all of them when it
    only reorders or redirects its metrics)."""
    mine = [(o.metric, o.direction) for o in objective.objectives]
    if tuple(mine) == BARE:
        return ""
    known = {m for m, _ in BARE}
    names = [m for m, _ in mine if m not in known] or [m for m, _ in mine]
    return "-".join(_SHORT.get(m, m) for m in names)


def storage_url(cfg: TunerConfig) -> str:
    """``study.storage``, or SQLite under ``paths.state_dir``."""
    return cfg.study.storage or f"sqlite:///{Path(cfg.paths.state_dir) / 'optuna.db'}"


def _schema_race(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from, is two workers creating one schema at
    once: a table, type or row the other has just created (an integrity or "already exists"
    error), or SQLite's lock while the other writes."""
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, IntegrityError | ProgrammingError):
            return True
        if isinstance(seen, OperationalError) and "database is locked" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def retry_schema_race(make: Callable[[], T], what: str, attempts: int = 6) -> T:
    """``make()``, retried when a database is being initialised by another worker at the same
    moment (two tuners starting on one fresh PostgreSQL database race to create the schema).
    Any other database error (one that cannot connect, say) is a :class:`StorageError` at once,
    in one line."""
    from sqlalchemy.exc import SQLAlchemyError

    caught: tuple[type[Exception], ...] = (SQLAlchemyError,)
    if "mlflow" in sys.modules:  # an MLflow store is what ``make`` opens (importing it costs ~3 s)
        from mlflow.exceptions import MlflowException

        caught = (SQLAlchemyError, MlflowException)
    for attempt in range(attempts):
        try:
            return make()
        except caught as exc:
            first = mask_credentials(str(getattr(exc, "orig", None) or exc).strip())
            first = (first.splitlines() or [type(exc).__name__])[0][:300]
            if not _schema_race(exc):
                raise StorageError(f"{what}: {first}") from exc
            if attempt == attempts - 1:
                raise StorageError(f"{what}: failing after {attempts} tries: {first}") from exc
            log.info("%s is being initialised by another worker (%s); retrying", what, first)
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


def sampler_seed(cfg: TunerConfig, n_existing: int) -> int:
    """The sampler's seed: ``study.seed`` plus the trials already stored, so a resumed study does
    not replay the random start-up points it has tried. On SQLite (one tuner) that is all: the
    same command on fresh storage draws the same configs until the sampler's start-up trials are
    measured (after them TPE follows measured values, which vary). On a database server
    (``study.storage=postgresql...``, several tuners on one study) it adds this worker's identity
    (``host:pid``), so tuners that start together do not draw the same configs."""
    seed = cfg.study.seed + n_existing
    if not storage_url(cfg).startswith("sqlite"):
        seed += zlib.crc32(worker_id().encode()) % 65_536
    return seed


def _sampler(cfg: TunerConfig, n_existing: int) -> optuna.samplers.BaseSampler:
    seed = sampler_seed(cfg, n_existing)
    s = cfg.study.sampler
    if s == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=cfg.study.n_startup_trials)
    if s == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if s == "grid":  # its seed shuffles the cells' ids: the same in every run and worker
        return GridSampler(grid(cfg.space), seed=cfg.study.seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=cfg.study.n_startup_trials)


def open_study(cfg: TunerConfig) -> optuna.Study:
    """Create the study, or load it when it has the same objectives and was measured on the same
    engine kind (else a :class:`ConfigError`, with nothing stored)."""
    if cfg.study.sampler == "gp":
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise ConfigError(
                "study.sampler=gp needs PyTorch (Optuna's GPSampler); pip install torch"
            )
    storage = storage_url(cfg)
    check_database(storage, "study.storage")  # one line, at once, when it is down
    try:
        Path(cfg.paths.state_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(
            f"cannot create paths.state_dir {cfg.paths.state_dir}: {exc.strerror or exc}; run "
            "from a writable directory or set paths.state_dir"
        ) from exc
    shown = hide_url(storage)
    name = study_name(cfg)
    directions = [o.direction for o in cfg.objective.objectives]
    n_existing = 0
    stored: optuna.Study | None = None
    with contextlib.suppress(KeyError):
        stored = retry_schema_race(
            lambda: optuna.load_study(study_name=name, storage=storage),
            f"Optuna storage {shown}",
        )
    if stored is not None:
        n_existing = len(stored.trials)
        _check_same(stored, cfg, storage)
    if cfg.study.warm_start:
        _warm_source(cfg)  # a missing source is refused before the study is created
    try:
        study = retry_schema_race(
            lambda: optuna.create_study(
                study_name=name,
                storage=storage,
                directions=directions,  # type: ignore[arg-type]  # validated: maximize|minimize
                sampler=_sampler(cfg, n_existing),
                load_if_exists=True,
            ),
            f"Optuna storage {shown}",
        )
    except ValueError as exc:
        raise ConfigError(f"study {name!r} exists with other objectives: {exc}") from exc
    _check_same(study, cfg, storage)  # another tuner may have created it meanwhile
    with warnings.catch_warnings():  # set_metric_names is "experimental" since Optuna 3.2
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([o.metric for o in cfg.objective.objectives])
    store_names(study, cfg)
    return study


def _check_same(study: optuna.Study, cfg: TunerConfig, storage: str) -> None:
    """A stored study is continued only with its objectives' directions, on the engine kind
    it was measured on (one stored before the engine was recorded has none, and is continued),
    and with the distributions it stored (:func:`tuner.stored_study.check_space`)."""
    name = study.study_name
    check_objective(study, cfg, storage)
    if cfg.mode != "screen":  # a screen asks from its stored choices (screen_resume)
        check_space(study, cfg, storage)
    storage = hide_url(storage)
    directions = [o.direction for o in cfg.objective.objectives]
    if [d.name.lower() for d in study.directions] != directions:
        raise ConfigError(
            f"study {name!r} in {storage} was created with directions "
            f"{[d.name.lower() for d in study.directions]}; this run asks for {directions}; "
            "set study.name to start a new study"
        )
    kind = engine_kind(study)
    if kind is not None and kind != cfg.engine.kind:
        raise ConfigError(
            f"study {name!r} in {storage} was measured on engine={kind}, this run is "
            f"engine={cfg.engine.kind}; simulated and real measurements never share a study: "
            "set study.name to start a new study"
        )


def check_objective(study: optuna.Study, cfg: TunerConfig, storage: str) -> None:
    """Refuse (one line, :class:`ConfigError`) to run or report ``study`` with an objective other
    than the one it stored (:func:`tuner.stored_study.objective_names`; a study stored before
    it was kept has none and passes), naming both and a study name to use."""
    stored, mine = objective_names(study), objective_of(cfg)
    if stored is None or stored == mine:
        return
    name = study.study_name
    option = objective_option(stored)
    again = f", or objective={option} to continue or report it" if option else ""
    raise ConfigError(
        f"study {name!r} in {hide_url(storage)} was measured with objective {', '.join(stored)}; "
        f"this run asks for {', '.join(mine)}; objectives never mix in a study: set "
        f"study.name={_other_name(cfg, name)} for a study of its own{again}"
    )


def objective_option(stored: list[str]) -> str | None:
    """The ``objective=`` option (a YAML of ``conf/objective/``) whose objectives are
    ``stored`` (``metric:direction`` each), or None."""
    for option in available("objective"):
        doc = yaml.safe_load((conf_dir() / "objective" / f"{option}.yaml").read_text()) or {}
        doc = doc.get("objective", doc)  # a file of package _global_ nests it
        specs = [f"{o['metric']}:{o['direction']}" for o in doc.get("objectives", [])]
        if specs == stored:
            return option
    return None


def _other_name(cfg: TunerConfig, taken: str) -> str:
    """A study name for ``cfg`` other than ``taken``: the default one, or ``taken`` with the
    objective's label."""
    label = objective_label(cfg.objective) or "throughput"
    name = replace(cfg, study=replace(cfg.study, name=None))
    fresh = study_name(name)
    return fresh if fresh != taken else f"{taken}-{label}"


# --- the queue ----------------------------------------------------------------------------------


def check_enqueue(cfg: TunerConfig, dists: Distributions) -> None:
    """``study.enqueue`` names only searched params (checked before the study is touched)."""
    for entry in cfg.study.enqueue:
        unknown = sorted(set(entry) - set(dists))
        if unknown:
            raise ConfigError(f"study.enqueue names {unknown}, not searched params {sorted(dists)}")


def fill_queue(
    study: optuna.Study,
    cfg: TunerConfig,
    dists: Distributions,
    shape: ModelShape,
    requests: list[RequestSpec],
    n_stored: int,
) -> None:
    """Enqueue what runs before the sampler is asked: the baseline, the warm start, the
    ``study.enqueue`` entries, and (once per study) the prescreen's picks."""
    # a baseline that has run, runs or will run; not one interrupted (FAIL): new, or run again
    if cfg.study.baseline_first and baseline_trial(study, which="live") is None:
        outside = defaults_outside(cfg.space)
        if outside and not n_stored:
            log.warning(
                "no baseline trial: vLLM's default of %s is outside the searched range",
                ", ".join(outside),
            )
        elif not outside:
            ran = baseline_trial(study, which="any") is not None  # and was interrupted
            study.enqueue_trial(defaults(cfg.space), user_attrs=dict(BASELINE))
            if n_stored:
                log.info(
                    "the baseline trial (vLLM's defaults) has not finished yet; enqueued again"
                    if ran
                    else "the study has no baseline trial (vLLM's defaults) yet; enqueued"
                )
    # the rest in any order: the configs whose compile key is warm in the shared cache first
    pending: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    if cfg.study.sampler == "grid":  # Optuna's grid counts an interrupted cell as visited
        pending += [(dict(t.params), None) for t in interrupted_cells(study)]
    if cfg.study.warm_start:
        pending += _warm_start(cfg, dists)
    pending += [({**defaults(cfg.space), **entry}, None) for entry in cfg.study.enqueue]
    summary: dict[str, Any] | None = None
    if cfg.study.prescreen.trials and prescreen_summary(study) is None:
        picks, summary = prescreen(cfg, shape, requests)
        pending += [
            ({**defaults(cfg.space), **c.params}, prescreen_attrs(c.predicted)) for c in picks
        ]
    root = cache_root(cfg)
    added = 0
    for params, attrs in warm_first(pending, lambda p: params_key(cfg, p[0]), root):
        new = enqueue_once(study, params, user_attrs=attrs)
        added += int(new and attrs is not None)  # the prescreen's picks carry attrs
    if summary is not None:  # recorded: a resumed study does not prescreen again
        store_prescreen(study, {**summary, "enqueued": added})


def mark_baseline(trial: optuna.Trial, cfg: TunerConfig) -> bool:
    """Whether ``trial`` runs vLLM's defaults: enqueued as the baseline, or sampled at them (the
    grid's cell of the defaults, or a draw), flagged here as :data:`BASELINE` so that the
    confirm stage's ``baseline`` pick and the verdict find it."""
    if is_baseline(trial):
        return True
    if defaults_outside(cfg.space) or not _same_params(trial.params, defaults(cfg.space)):
        return False
    for k, v in BASELINE.items():
        trial.set_user_attr(k, v)
    log.info("trial %d: sampled at vLLM's defaults, so it is a baseline trial", trial.number)
    return True


def _warm_start(cfg: TunerConfig, dists: Distributions) -> list[tuple[dict[str, Any], None]]:
    """The Pareto-best feasible configs of another study (enqueued once: :func:`enqueue_once`)."""
    source = _warm_source(cfg)
    best = source.best_trials
    out: list[tuple[dict[str, Any], None]] = []
    for t in best:
        params = {
            k: v
            for k, v in t.params.items()
            if k in dists and dists[k]._contains(dists[k].to_internal_repr(v))
        }
        out.append(({**defaults(cfg.space), **params}, None))
    log.info(
        "warm start: enqueued %d Pareto-best configs of study %s", len(best), source.study_name
    )
    return out


def search_start(
    study: optuna.Study,
    cfg: TunerConfig,
    params: dict[str, Any] | None = None,
    baseline: bool = False,
) -> Start | None:
    """Where a trial's capacity search goes after the workload's own replay, or None (the
    incumbent probe off, or no capacity known): the study's incumbent
    (:func:`tuner.stored_study.incumbent_capacity`; a search trial that loses there ends, a
    ``baseline`` trial, vLLM's defaults and the study's reference, goes on below it as from a
    prediction: docs/design.md, "The incumbent probe"), else
    the best capacity of the ``study.warm_start`` study as a prediction (``binding`` False: the
    search goes on from a loss there; its load factor is on that study's workload, so a warm
    start of the same workload predicts best). In the lever screen (``screen.predict_start``)
    a server of a config (``params``) measured before starts at its own crossing
    (:func:`_own_crossing`), any other after the defaults' first from the defaults' capacity,
    each as a prediction: every server still gets its own capacity, in fewer replays than from
    the workload's load."""
    if not needs_capacity(cfg.objective):
        return None
    metric = capacity_metric(cfg.objective)
    if cfg.mode == "screen":
        if not cfg.screen.predict_start:
            return None
        own = None if params is None else _own_crossing(study, params)
        start = own or incumbent_capacity(study, metric, baseline_only=True)
        return None if start is None else start.prediction()
    if not cfg.objective.capacity.incumbent_probe:
        return None
    own = incumbent_capacity(study, metric)
    if own is not None:
        return own.prediction() if baseline else own
    other = incumbent_capacity(_warm_source(cfg), metric) if cfg.study.warm_start else None
    return None if other is None else other.prediction()


def _own_crossing(study: optuna.Study, params: dict[str, Any]) -> Start | None:
    """The median crossing of the finished servers with ``params``
    (:func:`tuner.confirm.median_crossing`), a ``near`` start
    (:attr:`tuner.capacity.Start.near`: the search walks by narrow steps from there, up after a
    hold, down after a loss), or None; what it saved on an H100 and the simulator:
    docs/levers.md, "How it runs"."""
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return median_crossing(stored_trial.metrics(t) for t in done if _same_params(params, t.params))


async def trial_start(
    study: optuna.Study,
    cfg: TunerConfig,
    shape: ModelShape,
    requests: list[RequestSpec],
    params: dict[str, Any],
    baseline: bool = False,
) -> Start | None:
    """:func:`search_start`, else the capacity the simulator predicts for ``params``
    (:func:`tuner.prescreen.predict_start`, ``objective.capacity.predict_start``): where a
    trial of ``study`` goes after its own replay (``baseline``: vLLM's defaults' trial)."""
    start = search_start(study, cfg, params, baseline)
    return start or await predict_start(cfg, shape, requests, params)


def _warm_source(cfg: TunerConfig) -> optuna.Study:
    """The study ``study.warm_start`` names, else a :class:`ConfigError`."""
    storage = storage_url(cfg)
    try:
        return optuna.load_study(study_name=str(cfg.study.warm_start), storage=storage)
    except KeyError as exc:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise ConfigError(
            f"study.warm_start {cfg.study.warm_start!r} is not in {hide_url(storage)}; "
            f"have: {names}"
        ) from exc


def _same_params(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        w = b[k]
        if isinstance(v, bool) or isinstance(w, bool) or not isinstance(v, int | float):
            if v != w:
                return False
        elif not isinstance(w, int | float) or not math.isclose(float(v), float(w), rel_tol=1e-9):
            return False
    return True


def enqueue_once(
    study: optuna.Study, params: dict[str, Any], user_attrs: dict[str, Any] | None = None
) -> bool:
    """Enqueue ``params`` unless a trial with them has run, runs or waits. Unlike Optuna's
    ``skip_if_exists``, a FAIL trial (one a killed or interrupted tuner left) does not count, so
    the same command runs an interrupted enqueued config again."""
    for t in study.get_trials(deepcopy=False, states=LIVE):
        if _same_params(params, t.system_attrs.get("fixed_params", t.params)):
            return False
    study.enqueue_trial(params, user_attrs=user_attrs)
    return True
