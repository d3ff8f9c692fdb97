"""Every integration test's folder starts with an empty MLflow store whose schema exists (the
tuner's default ``tracking.uri`` is ``sqlite:///mlflow.db`` in the folder it runs in).

MLflow builds a new store's schema with its migrations, about 4 s on 2 cores, and the suite runs
the tuner with tracking in some 40 folders; here MLflow itself builds it once per session and
each test gets a copy. The tuner's own first-store path (creating the schema, the race between
two workers) still runs where the store lives elsewhere: ``tests/integration/test_postgres.py``
and the notebooks' studies."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()  # builds the schema
    return path


@pytest.fixture(autouse=True)
def migrated_mlflow_store(tmp_path: Path, mlflow_store: Path) -> None:
    shutil.copyfile(mlflow_store, tmp_path / "mlflow.db")
