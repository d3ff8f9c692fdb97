"""Stage 6 — record: one MLflow experiment per study, a parent run per invocation, a child run
per trial with params, metrics, tags and the trial's artifact folder.

Uses ``MlflowClient`` (explicit run ids, no global active run), in the shape of optuna-integration's
deprecated ``MLflowCallback``. Every string passes through ``mask`` first, so secrets the server
needs never reach the tracking store.

A trial that did not end (the tuner was stopped, or died) gets a FAILED child run too, tagged
``failure_reason`` ``interrupted`` like any failed trial (:meth:`Tracker.log_interrupted`;
:func:`log_interrupted` for the next run's crash recovery). Every run carries the tag
``tuner.worker`` (``host:pid`` of the tuner that opened it), so a run left RUNNING by a tuner that
no longer exists can be found and closed (:func:`close_open_runs`: KILLED, with the tag
``killed_reason``).

A tracking store that fails once the study runs (a tracking server gone) never costs the study:
each :class:`Tracker` call made during it that fails is one warning line, and the study goes
on; its results stay in the Optuna storage and the trial folders. Runs it left RUNNING are
closed by the next run (:func:`close_open_runs`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ParamSpec

from tuner.artifacts import TrialFolder
from tuner.capacity import shown
from tuner.errors import INTERRUPTED
from tuner.records import TrialResult
from tuner.stores import error_line, hide_url

__all__ = [
    "KILLED_REASON",
    "WORKER",
    "NullTracker",
    "Tracker",
    "close_open_runs",
    "find_parent",
    "log_interrupted",
    "open_tracker",
]

log = logging.getLogger(__name__)

_MAX_PARAM = 6000
_MAX_TAG = 5000

WORKER = "tuner.worker"
"""The tag naming the tuner (``host:pid``) that opened a run."""
KILLED_REASON = "killed_reason"
"""The tag saying why a run was ended KILLED (interrupted, or its tuner died)."""
_INHERITED = ("tuner.study", "engine", "model", "workload", "tuner.version", "optuna.version")
"""The parent's tags a child run made by crash recovery takes over (with :data:`WORKER`)."""


class NullTracker:
    """Tracking switched off (``tracking.enabled=false``)."""

    parent_run_id: str | None = None

    def log_trial(self, result: TrialResult, trial_dir: Path, tags: Mapping[str, str]) -> None:
        pass

    def log_interrupted(
        self, number: int, params: Mapping[str, Any], detail: str, trial_dir: Path
    ) -> None:
        pass

    def log_study_artifact(self, path: Path) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        pass

    def finish(
        self,
        status: str = "FINISHED",
        summary: Mapping[str, float] | None = None,
        reason: str | None = None,
    ) -> None:
        pass


P = ParamSpec("P")

RETRY_AFTER_S = 60.0
"""After a tracking call failed, the tracker skips calls for this long (the next trial's is
tried again)."""


class Tracker:
    """The MLflow runs of one invocation. Opening it raises when the store fails (the study
    checked it just before); every later call that fails is a warning (:meth:`_safely`)."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_name: str,
        tags: Mapping[str, str],
        mask: Callable[[str], str],
        role: str = "study",
    ) -> None:
        from mlflow import MlflowClient
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

        self._parent_tag = MLFLOW_PARENT_RUN_ID
        self._name_tag = MLFLOW_RUN_NAME
        self.mask = mask
        self.shown_uri = hide_url(uri)
        self.failed_at: float | None = None
        """When a call last failed (``time.monotonic``); None while calls succeed."""
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (
            exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
        )
        self.base_tags = {k: mask(str(v)) for k, v in tags.items()}
        run = self.client.create_run(
            self.experiment_id, run_name=run_name, tags={**self.base_tags, "tuner.role": role}
        )
        self.parent_run_id: str | None = run.info.run_id

    def _log_trial(self, result: TrialResult, trial_dir: Path, tags: Mapping[str, str]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        run = self.client.create_run(
            self.experiment_id,
            run_name=f"trial-{result.number:04d}",
            tags={
                **self.base_tags,
                **{k: self.mask(str(v)) for k, v in tags.items()},
                self._parent_tag: self.parent_run_id,
                "tuner.role": "trial",
            },
        )
        rid = run.info.run_id
        now = int(time.time() * 1000)
        params = [Param(k, self.mask(str(v))[:_MAX_PARAM]) for k, v in result.params.items()]
        params.append(Param("argv", self.mask(" ".join(result.argv))[:_MAX_PARAM]))
        metrics = [Metric(k, float(v), now, 0) for k, v in _metrics(result).items()]
        metrics += _capacity_steps(trial_dir, now)
        state = "pruned" if result.pruned else "ok" if result.ok else "failed"
        trial_tags = {
            "trial.number": str(result.number),
            "trial.state": state,
            "trial.baseline": str(result.baseline).lower(),
        }
        startup = result.launch.startup if result.launch else None
        if startup is not None and startup.compile_cache:  # hit or miss, and vLLM's key
            trial_tags["compile_cache"] = startup.compile_cache
            trial_tags["compile_hash"] = startup.compile_hash or startup.aot_hash or ""
        cap = result.metrics.get("capacity_rps")
        if cap is not None:  # "< 19.4" when the incumbent probe lost: the value is a bound
            m = result.metrics
            trial_tags["capacity"] = (
                shown(cap, m.get("capacity_censored"), m.get("capacity_rps_high")) + " req/s"
            )
        if result.pruned:
            trial_tags["pruned_reason"] = result.pruned
        if result.failure_reason:
            trial_tags["failure_reason"] = result.failure_reason
            trial_tags["failure_detail"] = self.mask(result.failure_detail or "")[:_MAX_TAG]
        rtags = [RunTag(k, v) for k, v in trial_tags.items()]
        for i in range(0, len(metrics), 900):  # MLflow's batch limit is 1000
            self.client.log_batch(
                rid,
                metrics=metrics[i : i + 900],
                params=params if i == 0 else [],
                tags=rtags if i == 0 else [],
            )
        if trial_dir.is_dir():
            self.client.log_artifacts(rid, str(trial_dir))
        status = "KILLED" if result.pruned else "FINISHED" if result.ok else "FAILED"
        self.client.set_terminated(rid, status)

    def _log_interrupted(
        self, number: int, params: Mapping[str, Any], detail: str, trial_dir: Path
    ) -> None:
        """Trial ``number``, stopped before it ended: a FAILED child run with ``failure_reason``
        ``interrupted``, its params and what its folder holds so far."""
        if self.parent_run_id is None:
            return
        _interrupted_run(
            self.client,
            self.experiment_id,
            self.parent_run_id,
            self.base_tags,
            number,
            {k: self.mask(str(v)) for k, v in params.items()},
            self.mask(detail),
            trial_dir,
        )

    def _log_study_artifact(self, path: Path) -> None:
        """A file for the invocation's parent run (e.g. the Pareto plot)."""
        if self.parent_run_id is not None:
            self.client.log_artifact(self.parent_run_id, str(path))

    def _set_tags(self, tags: Mapping[str, str]) -> None:
        """Tags on the invocation's parent run (e.g. the recommended trial)."""
        if self.parent_run_id is not None:
            for k, v in tags.items():
                self.client.set_tag(self.parent_run_id, k, self.mask(str(v))[:_MAX_TAG])

    def _log_metrics(self, metrics: Mapping[str, float]) -> None:
        """Metrics on the invocation's parent run (e.g. the confirm verdict's gain)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, 0) for k, v in metrics.items() if _finite(v)]
        if self.parent_run_id is not None and batch:
            self.client.log_batch(self.parent_run_id, metrics=batch)

    def _finish(
        self,
        status: str = "FINISHED",
        summary: Mapping[str, float] | None = None,
        reason: str | None = None,
    ) -> None:
        """End the parent run with ``status``; ``reason`` (why it was KILLED) goes to the tag
        :data:`KILLED_REASON`."""
        from mlflow.entities import Metric

        if self.parent_run_id is None:
            return
        now = int(time.time() * 1000)
        if summary:
            self.client.log_batch(
                self.parent_run_id, metrics=[Metric(k, v, now, 0) for k, v in summary.items()]
            )
        if reason:
            self.client.set_tag(self.parent_run_id, KILLED_REASON, self.mask(reason)[:_MAX_TAG])
        self.client.set_terminated(self.parent_run_id, status)
        self.parent_run_id = None

    def _safely(self, what: str, call: Callable[P, None], *args: P.args, **kw: P.kwargs) -> None:
        """``call``; a failure (the tracking server gone) is one warning, never the study's. For
        :data:`RETRY_AFTER_S` after a failure, calls are skipped (each would wait through the
        client's retries): a trial's with a warning, the study run's quietly."""
        if self.failed_at is not None:
            ago = time.monotonic() - self.failed_at
            if ago < RETRY_AFTER_S:
                level = logging.WARNING if what.startswith("logging trial") else logging.DEBUG
                log.log(
                    level,
                    "MLflow %s: %s skipped (a call failed %.0f s ago)",
                    self.shown_uri,
                    what,
                    ago,
                )
                return
        try:
            call(*args, **kw)
        except Exception as exc:  # MlflowException, requests' errors, OSError
            self.failed_at = time.monotonic()
            log.warning(
                "MLflow %s: %s failed (%s); the study goes on, its results are in the Optuna "
                "storage and the trial folders",
                self.shown_uri,
                what,
                error_line(exc),
            )
        else:
            self.failed_at = None

    def log_trial(self, result: TrialResult, trial_dir: Path, tags: Mapping[str, str]) -> None:
        """Trial ``result``'s child run: params, metrics, tags, its folder as artifacts."""
        self._safely(f"logging trial {result.number}", self._log_trial, result, trial_dir, tags)

    def log_interrupted(
        self, number: int, params: Mapping[str, Any], detail: str, trial_dir: Path
    ) -> None:
        """Trial ``number``, stopped before it ended: a FAILED child run with ``failure_reason``
        ``interrupted``, its params and what its folder holds so far."""
        what = f"logging interrupted trial {number}"
        self._safely(what, self._log_interrupted, number, params, detail, trial_dir)

    def log_study_artifact(self, path: Path) -> None:
        """A file for the invocation's parent run (e.g. the Pareto plot)."""
        self._safely(f"logging {path.name}", self._log_study_artifact, path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tags on the invocation's parent run (e.g. the recommended trial)."""
        self._safely("tagging the study run", self._set_tags, tags)

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        """Metrics on the invocation's parent run (e.g. the confirm verdict's gain)."""
        self._safely("logging the study run's metrics", self._log_metrics, metrics)

    def finish(
        self,
        status: str = "FINISHED",
        summary: Mapping[str, float] | None = None,
        reason: str | None = None,
    ) -> None:
        """End the parent run with ``status``; ``reason`` (why it was KILLED) goes to the tag
        :data:`KILLED_REASON`. When the store fails, the run stays RUNNING until the next run
        of the study closes it (KILLED: its tuner no longer runs)."""
        self._safely("ending the study run", self._finish, status, summary, reason)
        self.parent_run_id = None


def _interrupted_run(
    client: Any,
    experiment_id: str,
    parent_run_id: str,
    tags: Mapping[str, str],
    number: int,
    params: Mapping[str, str],
    detail: str,
    trial_dir: Path | None,
) -> str:
    """A FAILED child run of ``parent_run_id`` for trial ``number``, which did not end; its id.
    Tagged like any failed trial (``trial.state`` failed, ``failure_reason``, ``failure_detail``);
    ``params`` and ``detail`` are already masked."""
    from mlflow.entities import Param
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    run = client.create_run(
        experiment_id,
        run_name=f"trial-{number:04d}",
        tags={
            **tags,
            MLFLOW_PARENT_RUN_ID: parent_run_id,
            "tuner.role": "trial",
            "trial.number": str(number),
            "trial.state": "failed",
            "failure_reason": INTERRUPTED,
            "failure_detail": detail[:_MAX_TAG],
        },
    )
    rid = str(run.info.run_id)
    if params:
        client.log_batch(rid, params=[Param(k, v[:_MAX_PARAM]) for k, v in params.items()])
    if trial_dir is not None and trial_dir.is_dir():
        client.log_artifacts(rid, str(trial_dir))
    client.set_terminated(rid, "FAILED")
    return rid


def log_interrupted(
    uri: str, parent_run_id: str, number: int, params: Mapping[str, Any], detail: str
) -> None:
    """Crash recovery: trial ``number`` of the (dead) invocation ``parent_run_id`` did not end;
    its FAILED child run, with the parent's study, engine, model, workload and worker tags."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(parent_run_id)
    tags = {k: v for k, v in parent.data.tags.items() if k in (*_INHERITED, WORKER)}
    strs = {k: str(v) for k, v in params.items()}
    _interrupted_run(
        client, parent.info.experiment_id, parent_run_id, tags, number, strs, detail, None
    )


def _experiment_id(client: Any, experiment: str) -> str | None:
    exp = client.get_experiment_by_name(experiment)
    return None if exp is None else str(exp.experiment_id)


def find_parent(uri: str, experiment: str, worker: str) -> str | None:
    """The id of the study run (the invocation's parent) that tuner ``worker`` opened in
    ``experiment``, or None."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp_id = _experiment_id(client, experiment)
    if exp_id is None:
        return None
    if "'" in worker:  # host:pid never has one; no quoting in a search filter then
        return None
    runs = client.search_runs(
        [exp_id],
        filter_string=f"tags.`{WORKER}` = '{worker}' and tags.`tuner.role` = 'study'",
        max_results=1,
    )
    return str(runs[0].info.run_id) if runs else None


def close_open_runs(
    uri: str, experiment: str, study: str, dead: Callable[[str, float | None], str | None]
) -> list[str]:
    """End KILLED every run of ``study`` in ``experiment`` still RUNNING whose tuner is gone:
    ``dead(worker, started)`` (the run's start, epoch seconds) says why (the tag
    :data:`KILLED_REASON`), or None for a live one. Runs without a :data:`WORKER` tag are left
    alone. Returns a line per run closed."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp_id = _experiment_id(client, experiment)
    if exp_id is None:
        return []
    found: list[Any] = []  # every page first: a run closed would move the later pages
    token: str | None = None
    while True:
        page = client.search_runs(
            [exp_id],
            filter_string="attributes.status = 'RUNNING'",
            max_results=500,
            page_token=token,
        )
        found += [r for r in page if r.data.tags.get("tuner.study") == study]
        token = page.token
        if not token:
            break
    done: list[str] = []
    for run in found:
        worker = run.data.tags.get(WORKER)
        begun = run.info.start_time / 1000 if run.info.start_time else None
        why = dead(worker, begun) if worker else None
        if why is None:
            continue
        rid = run.info.run_id
        client.set_tag(rid, KILLED_REASON, why[:_MAX_TAG])
        client.set_terminated(rid, "KILLED")
        role = run.data.tags.get("tuner.role", "run")
        done.append(f"MLflow {role} run {run.info.run_name or rid} ({rid}): {why}")
    return done


def _metrics(result: TrialResult) -> dict[str, float]:
    out: dict[str, float] = dict(result.metrics)
    launch = result.launch
    if launch is not None:
        out["startup_s"] = float(launch.startup_s)
        for k in (
            "kv_cache_tokens",
            "max_concurrency",
            "kv_cache_gib",
            "model_load_gib",
            "model_load_s",
            "graph_capture_s",
            "graph_capture_gib",
            "init_engine_s",
            "compile_s",
        ):
            v = getattr(launch.facts, k)
            if v is not None:
                out[k] = float(v)
        for phase, seconds in (launch.startup.phases if launch.startup else {}).items():
            out[f"startup_{phase}_s"] = float(seconds)
    if result.predicted_kv_tokens is not None:
        out["predicted_kv_tokens"] = float(result.predicted_kv_tokens)
    out["failed_launch"] = 0.0 if result.ok or result.launch is not None else 1.0
    out["launched"] = float(result.launched)
    out["server_s"] = result.server_s
    out["trial_duration_s"] = result.duration_s
    for key, c in result.constraints.items():
        out[f"constraint.{key}"] = c
    return {k: v for k, v in out.items() if _finite(v)}


def _capacity_steps(trial_dir: Path, now: int) -> list[Any]:
    """The capacity search's steps (``capacity.json``) as metric histories, one step each:
    ``capacity_step.factor``, ``.rps``, ``.margin``, ``.held`` and its key metrics."""
    from mlflow.entities import Metric

    path = TrialFolder(trial_dir).capacity
    if not path.is_file():
        return []
    out = []
    for k, row in enumerate(json.loads(path.read_text()).get("steps", [])):
        for name, v in row.items():
            if isinstance(v, bool | int | float) and _finite(v):
                out.append(Metric(f"capacity_step.{name}", float(v), now, k))
    return out


def _finite(v: Any) -> bool:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return False
    return f == f and f not in (float("inf"), float("-inf"))


def open_tracker(
    enabled: bool,
    uri: str,
    experiment: str,
    run_name: str,
    tags: Mapping[str, str],
    mask: Callable[[str], str],
    role: str = "study",
) -> Tracker | NullTracker:
    """``role``: ``study`` for a tuning run, ``report`` for ``python -m tuner report``."""
    if not enabled:
        return NullTracker()
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return Tracker(uri, experiment, run_name, tags, mask, role)
