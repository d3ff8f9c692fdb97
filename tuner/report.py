"""``python -m tuner report study.name=NAME``: a stored study's tables, verdicts, exports and
figures again (:func:`run_report`), from its Optuna storage (SQLite or PostgreSQL) and, for the
trial folders not on this machine, its MLflow runs; nothing is run.
"""

from __future__ import annotations

import logging
from pathlib import Path

import optuna
from rich.console import Console

from tuner import stored_study, stored_trial
from tuner.artifacts import trial_dir
from tuner.config import TunerConfig
from tuner.console import print_pareto
from tuner.engine.argv import mask, secret_values
from tuner.errors import ConfigError
from tuner.publish import Published, publish
from tuner.recovery import worker_id
from tuner.storage import check_objective, storage_url, study_name
from tuner.stores import (
    check_database,
    check_tracking,
    hide_url,
    missing_sqlite,
    quick_tracking_retries,
)
from tuner.tracking import WORKER, open_tracker

log = logging.getLogger(__name__)

__all__ = ["run_report"]


def _trial_dirs_from_mlflow(study: optuna.Study, cfg: TunerConfig, dest: Path) -> dict[int, Path]:
    """Artifact folders of trials whose ``trial_dir`` is not on this machine (another worker's,
    or a deleted run dir), downloaded from their MLflow child runs."""
    missing = {t.number for t in study.trials if stored_trial.trial_dir(t) is None}
    if not missing or not cfg.tracking.enabled:
        return {}
    from mlflow import MlflowClient  # ~3 s to import: only with tracking on and folders missing

    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment or study.study_name)
    if exp is None:
        return {}
    out: dict[int, Path] = {}
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string="tags.`tuner.role` = 'trial'",
        order_by=["attributes.start_time DESC"],
        max_results=5000,
    )
    for run in runs:
        number = int(run.data.tags.get("trial.number", -1))
        if number not in missing or number in out:
            continue
        target = trial_dir(dest, number)
        target.mkdir(parents=True, exist_ok=True)
        try:
            client.download_artifacts(run.info.run_id, "", str(target))
        except Exception as exc:
            log.warning("could not download trial %d from MLflow: %s", number, exc)
            continue
        out[number] = target
    return out


def run_report(cfg: TunerConfig) -> Published:
    """``python -m tuner report study.name=NAME``: regenerate the exports, figures and tables of a
    stored study (SQLite or PostgreSQL storage, plus MLflow for trial folders on other machines)
    into this invocation's run dir, without running anything."""
    storage = storage_url(cfg)
    shown = hide_url(storage)
    name = study_name(cfg)
    if missing_sqlite(storage):
        raise ConfigError(f"no Optuna storage at {storage}; set study.storage or paths.state_dir")
    check_database(storage, "study.storage")  # one line, at once, when it is down
    if cfg.tracking.enabled:
        check_tracking(cfg.tracking.uri)
        quick_tracking_retries(cfg.tracking.uri)
    summaries = optuna.get_all_study_summaries(storage)
    if name not in {s.study_name for s in summaries}:
        have = ", ".join(sorted(s.study_name for s in summaries)) or "none"
        raise ConfigError(f"no study {name!r} in {shown}; stored studies: {have}")
    study = optuna.load_study(study_name=name, storage=storage)
    check_objective(study, cfg, storage)
    secrets = secret_values(cfg.engine, model=cfg.model)
    out_dir = Path(cfg.paths.output_dir)
    fetched = _trial_dirs_from_mlflow(study, cfg, out_dir / "trials")
    if fetched:
        log.info("downloaded %d trial folder(s) from MLflow", len(fetched))
    tracker = open_tracker(
        cfg.tracking.enabled,
        cfg.tracking.uri,
        cfg.tracking.experiment or name,
        f"report-{out_dir.name}",
        {"tuner.study": name, WORKER: worker_id()},
        lambda s: mask(s, secrets),
        role="report",
    )
    console = Console(width=160)
    status = "FAILED"
    try:
        console.print(
            f"Study {name}: {len(study.trials)} trials in {shown} "
            f"(workload {stored_study.workload_name(study) or '?'}, "
            f"model {stored_study.model_name(study) or '?'})"
        )
        print_pareto(study, cfg, console)
        published = publish(study, cfg, out_dir, tracker, console, trial_dirs=fetched)
        status = "FINISHED"
    finally:
        tracker.finish(status)
    console.print(f"Report written to {out_dir}: {', '.join(sorted(published.files))}")
    return published
