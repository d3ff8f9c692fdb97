"""Secrets and dead services, piece by piece: URL passwords hidden, the API key kept off the
command line, the tuner's own flags refused, a store that does not answer is one line at once,
and recovery masks what a killed tuner left. ``tests/integration/test_secrets.py`` runs the CLI."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf

from tuner.engine.argv import build_env, mask, secret_values, trial_argv
from tuner.errors import ConfigError, StorageError
from tuner.recovery import Lease, recover
from tuner.storage import retry_schema_race
from tuner.stores import (
    TRACKING_CLIENT_DEFAULTS,
    RunDirCheck,
    check_database,
    check_tracking,
    hide_url,
    mask_credentials,
    quick_tracking_retries,
)

PW = "PWsecret9"
DEAD_DB = f"postgresql+psycopg://u:{PW}@127.0.0.1:1/db"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (DEAD_DB, "postgresql+psycopg://u:***@127.0.0.1:1/db"),
        ("postgresql://u:p%40ss@db.example/x", "postgresql://u:***@db.example/x"),
        (f"http://bob:{PW}@mlflow:5000/", "http://bob:***@mlflow:5000/"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ],
)
def test_hide_url(url: str, shown: str) -> None:
    assert hide_url(url) == shown


def test_a_url_password_is_masked_in_free_text_by_its_place() -> None:
    text = f"storage: {DEAD_DB}\n- tracking.uri=http://bob:{PW}@h:1,study.n_trials=1"
    masked = mask_credentials(text)
    assert PW not in masked and masked.count("***") == 2
    assert "127.0.0.1:1/db" in masked and "study.n_trials=1" in masked
    # a short or common password masks only its URL, not every word equal to it
    assert mask("python -m tuner postgresql://tuner:tuner@h/db", []) == (
        "python -m tuner postgresql://tuner:***@h/db"
    )


def test_the_api_key_reaches_the_server_by_env_never_argv(make_cfg) -> None:
    key = "sk-SECRETkey987654"
    for extra in (f"engine.extra_args=[--api-key,{key}]", f"engine.extra_args=['--api-key={key}']"):
        cfg = make_cfg("+workload=chat", extra)
        argv = trial_argv(cfg, {}, port=1234, baseline=True)
        assert key not in " ".join(argv) and "--api-key" not in argv
        env = build_env(cfg.engine, cache_root=None, environ={}, model=cfg.model)
        assert env["VLLM_API_KEY"] == key
        assert key in secret_values(cfg.engine, {}, cfg.model)
    cfg = make_cfg("+workload=chat", f"+model.fixed_args.api-key={key}")
    assert key not in trial_argv(cfg, {}, port=1, baseline=True)
    assert (
        build_env(cfg.engine, cache_root=None, environ={}, model=cfg.model)["VLLM_API_KEY"] == key
    )


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ("engine.extra_args=[--host,0.0.0.0]", "engine.extra_args sets --host"),
        ("engine.extra_args=['--port=8000']", "engine.extra_args sets --port"),
        ("+model.fixed_args.host=0.0.0.0", "model.fixed_args sets --host"),
        ("+workload.server_args.port=8000", "workload.server_args sets --port"),
        ("+workload.server_args.api-key=sk-1234", "workload.server_args sets --api-key"),
    ],
)
def test_the_tuners_own_flags_are_refused(make_cfg, override: str, where: str) -> None:
    with pytest.raises(ConfigError, match=where) as err:
        make_cfg("+workload=chat", override)
    assert "\n" not in str(err.value)
    if "api-key" not in where:
        assert "VLLM_SERVER_DEV_MODE=1" in str(err.value)  # both engine configs set it


def test_a_dead_database_is_one_line_at_once() -> None:
    t0 = time.monotonic()
    with pytest.raises(StorageError) as err:
        check_database(DEAD_DB, "study.storage")
    assert time.monotonic() - t0 < 10
    msg = str(err.value)
    assert msg.startswith("cannot reach study.storage postgresql+psycopg://u:***@127.0.0.1:1/db")
    assert "Connection refused" in msg and PW not in msg and "\n" not in msg


def test_a_dead_tracking_server_is_one_line_at_once() -> None:
    t0 = time.monotonic()
    with pytest.raises(StorageError) as err:
        check_tracking(f"http://bob:{PW}@127.0.0.1:1")
    assert time.monotonic() - t0 < 15  # MLflow's own retries took 25 minutes
    msg = str(err.value)
    assert "cannot reach the MLflow tracking server http://bob:***@127.0.0.1:1" in msg
    assert "tracking=none" in msg and PW not in msg and "\n" not in msg
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # the probe's setting is undone


def test_only_the_schema_race_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy.exc import IntegrityError, OperationalError

    monkeypatch.setattr("tuner.storage.time.sleep", lambda s: None)
    calls = []

    def refused() -> None:
        calls.append(1)
        raise OperationalError("connect", {}, Exception(f"connection to {DEAD_DB} refused"))

    with pytest.raises(StorageError) as err:
        retry_schema_race(refused, "Optuna storage")
    assert len(calls) == 1 and PW not in str(err.value)

    def race_then_ok() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise IntegrityError("CREATE TABLE", {}, Exception("duplicate key pg_type"))
        return "ok"

    calls.clear()
    assert retry_schema_race(race_then_ok, "Optuna storage") == "ok" and len(calls) == 4


def test_the_lease_keeps_no_password_and_recovery_masks_the_trial_folder(tmp_path: Path) -> None:
    key = "sk-SECRETkey987654"
    study = optuna.create_study(study_name="s")
    tdir = tmp_path / "run" / "trial_0000"
    tdir.mkdir(parents=True)
    (tdir / "server.log").write_text(f"args: --api-key {key}\n")
    (tdir / "server-attempt1.log").write_text(f"api_key={key}\n")
    leases = tmp_path / "leases"
    lease = Lease.create(leases, "s", 0, None, f"http://bob:{PW}@mlflow:5000", tdir)
    assert PW not in lease.path(leases).read_text()
    assert (
        json.loads(lease.path(leases).read_text())["tracking_uri"] == "http://bob:***@mlflow:5000"
    )
    # the tuner that wrote it is gone (kill -9): a pid that ran something else and exited
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(lease.path(leases).read_text())
    lease.path(leases).write_text(json.dumps({**data, "tuner_pid": int(dead.stdout)}))
    out = recover(study, leases, [key])
    assert out.notes and not list(leases.glob("*.json"))
    for name in ("server.log", "server-attempt1.log"):
        text = (tdir / name).read_text()
        assert key not in text and "***" in text


def test_an_unwritable_run_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "outputs").write_text("a file where the run folders would go")
    cfg = OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path / "outputs" / "runs" / "x")}}})
    with pytest.raises(SystemExit) as exit_:
        RunDirCheck().on_run_start(config=cfg)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot create the run folder") and "hydra.run.dir" in err
    assert len(err.splitlines()) == 1


def test_a_tracking_server_gets_short_client_retries_unless_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for k in TRACKING_CLIENT_DEFAULTS:
        monkeypatch.delenv(k, raising=False)
    assert quick_tracking_retries("sqlite:///mlflow.db") == {}
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "300")  # the user's own stays
    done = quick_tracking_retries("https://mlflow.example:5000")
    assert done == {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    }
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "300"
    pool = logging.getLogger("urllib3.connectionpool")
    retry = "Retrying (%r) after connection broken by %r: %s"
    args = ("Retry(total=1)", "ConnectionRefused", "/api/2.0/mlflow/runs/create")
    rec = pool.makeRecord(pool.name, logging.WARNING, __file__, 1, retry, args, None)
    assert not pool.filter(rec)
    other = pool.makeRecord(
        pool.name, logging.WARNING, __file__, 1, retry, args[:2] + ("/x",), None
    )
    assert pool.filter(other)
