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

import fcntl
import json
import os
import shutil
import tempfile
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
    store itself here.

    Once per session, not per worker: under pytest-xdist the first worker to need it runs it,
    holding a lock in the folder the workers' temp folders share (their session's, so never an
    earlier session's study), and the others wait for it there and read the same study (~26 s
    on 2 cores, once instead of on each worker). Tests only read it (those that change it work
    on a copy), so the workers may read it at once."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return _run_reference(tmp_path_factory.mktemp("reference"))
    shared = tmp_path_factory.getbasetemp().parent
    with (shared / "reference.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = shared / "reference.json"
        if done.is_file():
            ran = json.loads(done.read_text())
            return reference.Reference(Path(ran["cwd"]), ran["stdout"], ran["stderr"])
        ref = _run_reference(Path(tempfile.mkdtemp(prefix="reference-", dir=shared)))
        done.write_text(
            json.dumps({"cwd": str(ref.cwd), "stdout": ref.stdout, "stderr": ref.stderr})
        )
        return ref


def _run_reference(cwd: Path) -> reference.Reference:
    p = tuner(cwd, *reference.ARGS, env=reference.ENV, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return reference.Reference(cwd=cwd, stdout=p.stdout, stderr=p.stderr)
