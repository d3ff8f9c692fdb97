"""The stored study: the one place that writes and reads the attributes of the Optuna study itself
(its trials: :mod:`tuner.stored_trial`), read back by the next run, ``python -m tuner report``,
notebooks and scripts, also from studies an older tuner stored; and the study-level questions asked
of its trials (:func:`baseline_trials`, :func:`pareto_rows`).

Its user attributes (the system attributes are Optuna's own):

- ``workload``, ``model``, ``engine`` (the engine kind; none in a study stored before it was
  kept), ``objective`` (its objectives as ``metric:direction`` strings; none in a study stored
  before it was kept): set by every run that opens the study (:func:`store_names`).
- ``prescreen``: the prescreen's summary and ``enqueued``; set once (:func:`store_prescreen`).
- ``confirm``: the confirm stage's :class:`ConfirmRecord`: ``load_factor``, ``duration_factor``,
  ``seeds``, ``rounds``, ``min_effect``, ``n_trials`` (the study's trials then), ``candidates``,
  ``results`` and ``verdict``; a record stored before rounds, ``min_effect``, ``n_trials`` or the
  verdict lacks them (read as one round, and None).
- ``confirm_runs``: each confirm server's results as soon as it ends (:class:`ConfirmRuns`): the
  stress it ran under (``key``) and, per ``trial/round``, each seed's metrics, constraints and
  failure; a run of the same command after an interruption reuses them.
- ``recommended_trial``: the trial the last publish recommended (:func:`store_recommended`).
- ``screen``: a lever screen's levers as it ran them (name → flag, value, numerics, changes,
  source, sim), updated by each run of the screen (:func:`store_screen`); a search study has none.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import optuna
from optuna.distributions import CategoricalDistribution

from tuner import stored_trial
from tuner.capacity import Start
from tuner.config import ConfirmConfig, TunerConfig
from tuner.errors import ConfigError, machine_may_have_failed
from tuner.records import Candidate, ConfirmResult, TrialResult, to_jsonable
from tuner.score import PER_GPU
from tuner.space import distributions, override_value
from tuner.stores import hide_url
from tuner.verdict import Verdict

__all__ = [
    "check_space",
    "BaselineFilter",
    "ConfirmRecord",
    "ConfirmRuns",
    "baseline_trial",
    "baseline_trials",
    "engine_kind",
    "incumbent_capacity",
    "objective_names",
    "model_name",
    "objective_of",
    "pareto_rows",
    "prescreen_summary",
    "recommended_trial",
    "store_names",
    "store_prescreen",
    "store_recommended",
    "store_screen",
    "screen_levers",
    "stored_distributions",
    "stored_rel_width",
    "workload_name",
]

_WORKLOAD = "workload"
_MODEL = "model"
_ENGINE = "engine"
_OBJECTIVE = "objective"
_PRESCREEN = "prescreen"
_CONFIRM = "confirm"
_RECOMMENDED = "recommended_trial"
_SCREEN = "screen"
_REL_WIDTH = "capacity_rel_width"


def store_names(study: optuna.Study, cfg: TunerConfig) -> None:
    """The workload, the model and the engine kind of the run that opened the study, and the
    capacity search's bracket width it measured with (:func:`stored_rel_width`)."""
    study.set_user_attr(_WORKLOAD, cfg.workload.name)
    study.set_user_attr(_MODEL, cfg.model.name)
    study.set_user_attr(_ENGINE, cfg.engine.kind)
    study.set_user_attr(_OBJECTIVE, objective_of(cfg))
    study.set_user_attr(_REL_WIDTH, cfg.objective.capacity.rel_width)


def stored_rel_width(study: optuna.Study) -> float | None:
    """``objective.capacity.rel_width`` of the last run that measured the study (None: stored
    before it was recorded). The screen's intervals take their floor from it, so that ``report``
    gives the run's verdict without being told the run's overrides."""
    value = study.user_attrs.get(_REL_WIDTH)
    return float(value) if isinstance(value, int | float) else None


def objective_of(cfg: TunerConfig) -> list[str]:
    """The run's objectives as the study stores them: ``metric:direction`` each."""
    return [f"{o.metric}:{o.direction}" for o in cfg.objective.objectives]


def objective_names(study: optuna.Study) -> list[str] | None:
    """The objectives :func:`store_names` stored, or None for a study stored before."""
    value = study.user_attrs.get(_OBJECTIVE)
    return None if value is None else [str(v) for v in value]


def engine_kind(study: optuna.Study) -> str | None:
    return _name(study, _ENGINE)


def workload_name(study: optuna.Study) -> str | None:
    return _name(study, _WORKLOAD)


def model_name(study: optuna.Study) -> str | None:
    return _name(study, _MODEL)


def _name(study: optuna.Study, key: str) -> str | None:
    value = study.user_attrs.get(key)
    return None if value is None else str(value)


def store_prescreen(study: optuna.Study, summary: Mapping[str, Any]) -> None:
    """The prescreen's summary, with ``enqueued``: the study does not prescreen again."""
    study.set_user_attr(_PRESCREEN, dict(summary))


def prescreen_summary(study: optuna.Study) -> dict[str, Any] | None:
    """The summary :func:`store_prescreen` stored, or None if the study was not prescreened."""
    data = study.user_attrs.get(_PRESCREEN)
    return dict(data) if isinstance(data, dict) else None


@dataclass(frozen=True)
class ConfirmRecord:
    """What the confirm stage stored: the stress settings it ran with, its candidates, their
    results and the verdict (decided by :func:`tuner.confirm.conclude`)."""

    load_factor: float
    duration_factor: float
    seeds: tuple[int, ...]
    rounds: int
    min_effect: float | None
    n_trials: int | None
    """The study's trials when it was stored."""
    candidates: tuple[Candidate, ...]
    results: tuple[ConfirmResult, ...]
    verdict: Verdict | None
    """None also for one that cannot be read."""

    @staticmethod
    def of(
        cc: ConfirmConfig,
        n_trials: int,
        candidates: Sequence[Candidate],
        results: Sequence[ConfirmResult],
        verdict: Verdict,
    ) -> ConfirmRecord:
        """The record of a confirm stage run with ``cc`` on a study of ``n_trials`` trials."""
        return ConfirmRecord(
            load_factor=cc.load_factor,
            duration_factor=cc.duration_factor,
            seeds=tuple(cc.seeds),
            rounds=cc.rounds,
            min_effect=cc.min_effect,
            n_trials=n_trials,
            candidates=tuple(candidates),
            results=tuple(results),
            verdict=verdict,
        )

    @staticmethod
    def from_study(study: optuna.Study) -> ConfirmRecord | None:
        """The study's record, or None if the confirm stage has not stored one."""
        data = study.user_attrs.get(_CONFIRM)
        if not isinstance(data, dict):
            return None
        return ConfirmRecord(
            load_factor=data["load_factor"],
            duration_factor=data["duration_factor"],
            seeds=tuple(data["seeds"]),
            rounds=data.get("rounds", 1),
            min_effect=data.get("min_effect"),
            n_trials=data.get("n_trials"),
            candidates=tuple(
                Candidate(**{**c, "picks": tuple(c["picks"]), "serve_args": tuple(c["serve_args"])})
                for c in data.get("candidates", [])
            ),
            results=tuple(
                ConfirmResult(**{**r, "picks": tuple(r["picks"]), "runs": tuple(r["runs"])})
                for r in data.get("results", [])
            ),
            verdict=_verdict(data.get("verdict")),
        )

    def as_dict(self) -> dict[str, Any]:
        """The record as stored (``confirm.json`` too); a key a record read from an older study
        lacked (None here) stays out."""
        out: dict[str, Any] = {
            "load_factor": self.load_factor,
            "duration_factor": self.duration_factor,
            "seeds": list(self.seeds),
            "rounds": self.rounds,
            "min_effect": self.min_effect,
            "n_trials": self.n_trials,
            "candidates": to_jsonable(list(self.candidates)),
            "results": to_jsonable(list(self.results)),
            "verdict": None if self.verdict is None else self.verdict.as_dict(),
        }
        return {k: v for k, v in out.items() if v is not None}

    def store(self, study: optuna.Study) -> None:
        study.set_user_attr(_CONFIRM, self.as_dict())

    def reusable(self, cc: ConfirmConfig) -> dict[int, ConfirmResult]:
        """The verdicts a run with ``cc`` takes as they are, by trial: those run with the same
        stress settings and rounds, less those with a server that failed in a way that may be
        the machine's (:data:`~tuner.errors.MACHINE_FAILURES`): that candidate runs again."""
        if not self.same_stress(cc):
            return {}
        return {
            r.trial: r
            for r in self.results
            if not machine_may_have_failed(row.get("failure_reason") for row in r.runs)
        }

    def same_stress(self, cc: ConfirmConfig) -> bool:
        """Run with the stress settings and rounds of ``cc``: its results stand for this run's."""
        return (
            self.load_factor == cc.load_factor
            and self.duration_factor == cc.duration_factor
            and self.seeds == tuple(cc.seeds)
            and self.rounds == cc.rounds
        )


_CONFIRM_RUNS = "confirm_runs"


@dataclass
class ConfirmRuns:
    """The confirm servers that ended, stored one by one (``confirm_runs``), so that a confirm
    stage cut short (Ctrl-C, a lost machine) goes on where it stopped: the same command runs only
    the ``(trial, round)`` servers not stored under the same stress. ``key`` is a digest of what
    decides a server's numbers: the stressed workloads (one per seed), the objective and its
    SLOs, and the confirm settings that act on a server (load, duration, seeds, the capacity
    search's settings)."""

    key: str
    runs: dict[str, list[dict[str, Any]]]
    """``"trial/round"`` → one entry per seed: ``seed``, ``metrics``, ``constraints``,
    ``failure_reason``, ``failure_detail``."""

    @staticmethod
    def digest(*parts: Any) -> str:
        text = json.dumps(to_jsonable(list(parts)), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @staticmethod
    def of(study: optuna.Study, key: str) -> ConfirmRuns:
        """The runs ``study`` stored under ``key`` (none under another key)."""
        data = study.user_attrs.get(_CONFIRM_RUNS)
        if not isinstance(data, dict) or data.get("key") != key:
            return ConfirmRuns(key, {})
        return ConfirmRuns(key, dict(data.get("runs", {})))

    def get(self, trial: int, rnd: int) -> list[tuple[int, TrialResult]] | None:
        """The stored server of ``trial`` in round ``rnd``: ``(seed, result)`` per seed."""
        rows = self.runs.get(f"{trial}/{rnd}")
        if rows is None or machine_may_have_failed(r.get("failure_reason") for r in rows):
            return None  # none, or one stored before such failures were run again
        return [
            (
                int(r["seed"]),
                TrialResult(
                    number=trial,
                    params={},
                    argv=(),
                    values=None,
                    constraints=dict(r["constraints"]),
                    metrics=dict(r["metrics"]),
                    failure_reason=r.get("failure_reason"),
                    failure_detail=r.get("failure_detail"),
                ),
            )
            for r in rows
        ]

    def put(
        self, study: optuna.Study, trial: int, rnd: int, got: Sequence[tuple[int, TrialResult]]
    ) -> None:
        """Store the server of ``trial`` in round ``rnd`` (``(seed, result)`` per seed), unless
        it failed in a way that may be the machine's (:data:`~tuner.errors.MACHINE_FAILURES`):
        the next run tries that one again, at the cost of one start."""
        if machine_may_have_failed(r.failure_reason for _, r in got):
            return
        self.runs[f"{trial}/{rnd}"] = [
            {
                "seed": seed,
                "metrics": to_jsonable(r.metrics),
                "constraints": to_jsonable(r.constraints),
                "failure_reason": r.failure_reason,
                "failure_detail": r.failure_detail,
            }
            for seed, r in got
        ]
        study.set_user_attr(_CONFIRM_RUNS, {"key": self.key, "runs": self.runs})


def _verdict(data: Any) -> Verdict | None:
    if not isinstance(data, dict):
        return None
    try:
        return Verdict.from_dict(data)
    except (TypeError, ValueError, KeyError):
        return None


def stored_distributions(study: optuna.Study) -> dict[str, optuna.distributions.BaseDistribution]:
    """Each param's distribution as the study stored it (its first trial that asked it): Optuna
    refuses to ask a param again from a distribution of another kind or log scale, or, for a
    categorical, from other choices (``CategoricalDistribution does not support dynamic value
    space``); a range (low, high, step) may change."""
    out: dict[str, optuna.distributions.BaseDistribution] = {}
    for t in study.get_trials(deepcopy=False):
        for name, dist in t.distributions.items():
            out.setdefault(name, dist)
    return out


def check_space(study: optuna.Study, cfg: TunerConfig, storage: str) -> None:
    """Refuse (one line, :class:`ConfigError`) a searched param that ``study`` stored with a
    distribution Optuna will not ask it from again: a categorical's (or bool's) other choices
    (``space.params.X.choices`` changed by an override, an edited ``conf/space/*.yaml`` or another
    ``space=``; Optuna's "CategoricalDistribution does not support dynamic value space" at the
    first ask), another kind (int, float, categorical) or another log scale; naming the stored
    and this run's, and the way out. An int or float range (low, high, step) may change."""
    stored = stored_distributions(study)
    for name, mine in distributions(cfg.space).items():
        old = stored.get(name)
        if old is None:
            continue
        if isinstance(old, CategoricalDistribution) and isinstance(mine, CategoricalDistribution):
            if list(old.choices) == list(mine.choices):
                continue
            what = f"with choices {list(old.choices)}; this run's are {list(mine.choices)}"
            keep = f"keep the stored choices (space.params.{name}.choices={_override(old)})"
        elif type(old) is type(mine) and getattr(old, "log", False) == getattr(mine, "log", False):
            continue
        else:
            what = f"as {_shown(old)}; this run asks it as {_shown(mine)}"
            keep = f"keep space.params.{name} as stored"
        raise ConfigError(
            f"study {study.study_name!r} in {hide_url(storage)} stores {name} {what}, and Optuna "
            f"keeps a param's choices and kind for a study's life: {keep}, or set study.name to "
            "start a new study"
        )


def _override(dist: CategoricalDistribution) -> str:
    """A categorical's choices as a Hydra override's list (``[null,fp8]``)."""
    return "[" + ",".join(override_value(v) for v in dist.choices) + "]"


def _shown(dist: optuna.distributions.BaseDistribution) -> str:
    if isinstance(dist, CategoricalDistribution):
        return f"a categorical of {list(dist.choices)}"
    kind = "an int" if isinstance(dist, optuna.distributions.IntDistribution) else "a float"
    scale = ", log scale" if getattr(dist, "log", False) else ""
    return f"{kind} range{scale}"


def store_screen(study: optuna.Study, levers: Mapping[str, Mapping[str, Any]]) -> None:
    """Mark the study a lever screen and keep its levers (merged with those stored before)."""
    have = dict(screen_levers(study) or {})
    study.set_user_attr(_SCREEN, to_jsonable({**have, **levers}))


def screen_levers(study: optuna.Study) -> dict[str, dict[str, Any]] | None:
    """A lever screen's levers (:func:`store_screen`); None for a study that is not a screen."""
    data = study.user_attrs.get(_SCREEN)
    return None if data is None else {str(k): dict(v) for k, v in dict(data).items()}


def store_recommended(study: optuna.Study, trial: int) -> None:
    """The trial the report recommends (the MLflow tag ``tuner.recommended_trial`` says it too)."""
    study.set_user_attr(_RECOMMENDED, trial)


def recommended_trial(study: optuna.Study) -> int | None:
    number = study.user_attrs.get(_RECOMMENDED)
    return None if number is None else int(number)


# --- the study's trials -------------------------------------------------------------------------


def incumbent_capacity(
    study: optuna.Study, metric: str | None = "capacity_rps", *, baseline_only: bool = False
) -> Start | None:
    """The best SLO capacity measured so far as a load factor on the workload's (the
    ``capacity_factor`` of the feasible trial with the highest ``metric``, not one censored
    above; with ``baseline_only``, of vLLM's defaults' trials only), or None before one: where a
    new trial's capacity search probes first. ``metric``
    ``capacity_per_gpu_rps`` ranks per GPU, and the start carries the incumbent's GPUs (those
    it leased; for a trial stored without them, ``capacity_rps`` / per GPU) so that a server on
    other GPUs scales it
    (:func:`tuner.capacity.for_gpus`)."""
    metric = metric or "capacity_rps"
    best: tuple[float, float, float, int | None] | None = None
    for t in study.get_trials(deepcopy=False):
        if not stored_trial.feasible(t) or (baseline_only and not stored_trial.is_baseline(t)):
            continue
        rps = stored_trial.metric(t, "capacity_rps")
        factor = stored_trial.metric(t, "capacity_factor")
        value = stored_trial.metric(t, metric)
        if rps is None or factor is None or value is None or min(rps, factor, value) <= 0:
            continue
        if (stored_trial.metric(t, "capacity_censored") or 0.0) < 0:
            continue
        gpus = (stored_trial.gpu_count(t) or round(rps / value)) if metric == PER_GPU else None
        if best is None or value > best[0]:
            best = (value, rps, factor, gpus)
    return None if best is None else Start(best[2], best[1], best[3])


BaselineFilter = Literal["any", "live", "measured", "feasible"]
"""Which baseline trials (vLLM's defaults) count; each caller needs its own: ``any`` (every state:
the figures draw every run of the defaults with data, :mod:`tuner.plots.write`), ``live`` (ran,
runs or will run, not an interrupted FAIL: whether :func:`tuner.storage.fill_queue` enqueues it
again), ``measured`` (feasible or not: the reference of the confirm stage's gains,
:func:`tuner.confirm.pick`), ``feasible`` (the Pareto table's "vs baseline": :func:`pareto_rows`).
"""

_BASELINE_FILTERS: dict[str, Callable[[optuna.trial.FrozenTrial], bool]] = {
    "any": lambda t: True,
    "live": lambda t: t.state in stored_trial.LIVE,
    "measured": stored_trial.measured,
    "feasible": stored_trial.feasible,
}


def baseline_trials(
    study: optuna.Study, *, which: BaselineFilter
) -> list[optuna.trial.FrozenTrial]:
    """The study's baseline trials that pass ``which`` (:data:`BaselineFilter`), by number. Not
    copied (Optuna's ``deepcopy=False``): read them, do not change them."""
    keep = _BASELINE_FILTERS[which]
    return [t for t in study.get_trials(deepcopy=False) if stored_trial.is_baseline(t) and keep(t)]


def baseline_trial(
    study: optuna.Study, *, which: BaselineFilter
) -> optuna.trial.FrozenTrial | None:
    """The first of :func:`baseline_trials`, if any."""
    return next(iter(baseline_trials(study, which=which)), None)


def pareto_rows(study: optuna.Study, cfg: TunerConfig) -> list[dict[str, Any]]:
    """Each Pareto-best trial with its values and its gain in % over the feasible baseline: the
    first of its own machine (:func:`tuner.stored_trial.machine`), else the first."""
    objs = list(study.metric_names or [o.metric for o in cfg.objective.objectives])
    bases = baseline_trials(study, which="feasible")
    rows = []
    for tr in sorted(study.best_trials, key=lambda x: x.number):
        here = [b for b in bases if stored_trial.machine(b) == stored_trial.machine(tr)]
        base = next(iter(here or bases), None)
        row: dict[str, Any] = {"trial": tr.number, "params": dict(tr.params)}
        censored = stored_trial.metric(tr, "capacity_censored")
        if censored:  # the capacity is a bound: -1 below it ("< X"), 1 at least it (">= X")
            row["capacity_censored"] = censored
            row["capacity_rps_high"] = stored_trial.metric(tr, "capacity_rps_high")
        for i, (m, v) in enumerate(zip(objs, tr.values or [], strict=False)):
            row[m] = v
            if base is not None and base.values:
                b = base.values[i]
                row[f"{m}_vs_baseline_pct"] = (v - b) / abs(b) * 100.0 if b else None
        rows.append(row)
    return rows
