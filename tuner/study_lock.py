"""One worker at a time prepares a shared study: the lock :func:`tuner.study.run` holds while it
recovers what a dead tuner left and enqueues the baseline, the warm start and the prescreen's
picks (:func:`tuner.storage.fill_queue`).

Those steps read the study, then write to it ("no live baseline trial, so enqueue one"). Two
workers that start together on one PostgreSQL study both read "none" and both enqueue, and the
study then runs vLLM's defaults twice (seen in CI, ``tests/integration/test_postgres.py``,
2026-12-03). Optuna's storages have no lock of their own, so the lock is the database's:

- PostgreSQL: a session-level advisory lock (``pg_advisory_lock``) keyed by the study's name,
  held on its own connection and released when that connection closes, also when the process
  dies;
- SQLite: an ``flock`` on a file beside the database (SQLite is one host's file), released by
  the kernel when the process dies;
- any other storage: no lock (one line at debug level).

A worker that finds the lock held says so in one line and waits for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import zlib
from collections.abc import Iterator
from pathlib import Path

from tuner.errors import StorageError
from tuner.stores import hide_url

__all__ = ["prepare_lock"]

log = logging.getLogger("tuner")


@contextlib.contextmanager
def prepare_lock(storage: str, name: str) -> Iterator[None]:
    """Hold the lock of study ``name`` in ``storage`` (an Optuna storage URL) for the block."""
    if storage.startswith("sqlite:///"):
        with _file_lock(Path(storage.removeprefix("sqlite:///") + ".prepare-lock"), name):
            yield
    elif storage.startswith(("postgresql", "postgres")):
        with _advisory_lock(storage, name):
            yield
    else:
        log.debug("no lock for preparing study %s on %s", name, hide_url(storage))
        yield


def _waiting(name: str) -> None:
    log.info("another worker is preparing study %s; waiting for it", name)


@contextlib.contextmanager
def _file_lock(path: Path, name: str) -> Iterator[None]:
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _waiting(name)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _advisory_lock(storage: str, name: str) -> Iterator[None]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import SQLAlchemyError

    key = zlib.crc32(f"tuner-prepare:{name}".encode())  # fits PostgreSQL's bigint key
    engine = create_engine(storage)
    try:
        with engine.connect() as conn:
            try:
                got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()
                if not got:
                    _waiting(name)
                    conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            except SQLAlchemyError as exc:
                first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
                raise StorageError(
                    f"cannot lock study {name} on {hide_url(storage)}: {first[:300]}"
                ) from exc
            try:
                yield
            finally:
                with contextlib.suppress(SQLAlchemyError):
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
    finally:
        engine.dispose()
