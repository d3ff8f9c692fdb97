"""Every integration test's folder starts with an empty MLflow store whose schema exists (the
tuner's default ``tracking.uri`` is ``sqlite:///mlflow.db`` in the folder it runs in).

MLflow builds a new store's schema with its migrations, about 4 s on 2 cores, and the suite runs
the tuner with tracking in some 40 folders; here MLflow itself builds it once per session and
each test gets a copy. The tuner's own first-store path (creating the schema, the race between
two workers) still runs where the store lives elsewhere: ``tests/integration/test_postgres.py``
and the reference study (its folder is its own, and the notebooks read a copy of it).

Every test here is ``slow`` (left out of the fast tier, ``pytest -m "not slow"``) unless it is
marked ``fast``; the fast tier runs the reference study (``reference_study``,
``tests/helpers/reference.py``) and the tests that read it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import reference
from helpers.cli import tuner


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()  # builds the schema
    return path


@pytest.fixture(autouse=True)
def migrated_mlflow_store(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if request.node.get_closest_marker("fast") is None:  # the fast tier's tests track nothing
        shutil.copyfile(request.getfixturevalue("mlflow_store"), tmp_path / "mlflow.db")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents and item.get_closest_marker("fast") is None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def reference_study(tmp_path_factory: pytest.TempPathFactory) -> reference.Reference:
    """The reference study (``tests/helpers/reference.py``), run once through the CLI; read it,
    or change a :meth:`~helpers.reference.Reference.copy` of it. The tuner creates its MLflow
    store itself here."""
    cwd = tmp_path_factory.mktemp("reference")
    p = tuner(cwd, *reference.ARGS, env=reference.ENV, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return reference.Reference(cwd=cwd, stdout=p.stdout, stderr=p.stderr)
