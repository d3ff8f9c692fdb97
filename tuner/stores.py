"""Where the tuner keeps what it measures — the run folder, the Optuna storage, the MLflow
tracking store — checked before a study starts, and their URLs shown without passwords.

A tracking server that goes away later costs seconds per call, not minutes:
:func:`quick_tracking_retries` gives MLflow's HTTP client short retries and timeouts in this
process (unless the user set them), and the tracker makes a failed call a warning
(:mod:`tuner.tracking`).

A store that cannot be reached or written is one line, within seconds, before anything is
launched: :func:`check_database` connects once (10 s at most) to a database URL
(``study.storage``, or ``tracking.uri`` when it is one), :func:`check_tracking` asks an MLflow
tracking server once without retries, and :class:`RunDirCheck` (a Hydra callback,
``conf/hydra/default.yaml``) creates the run folder before Hydra does, so a read-only working
directory is a line, not Hydra's traceback. Passwords in those URLs are never shown or written:
:func:`hide_url` renders a URL as SQLAlchemy does with ``hide_password``, :func:`mask_credentials`
hides the ``user:password@`` of any URL in free text.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hydra.experimental.callback import Callback

from tuner.errors import StorageError

__all__ = [
    "MASK",
    "RunDirCheck",
    "check_database",
    "TRACKING_CLIENT_DEFAULTS",
    "check_tracking",
    "error_line",
    "hide_url",
    "mask_credentials",
    "missing_sqlite",
    "quick_tracking_retries",
]

MASK = "***"

_CREDENTIALS = re.compile(r"\b(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*:)[^\s@'\"]+(?=@)")
"""``scheme://user:`` and the password up to the ``@`` of a URL in free text."""

_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "oracle")
"""URL schemes (before any ``+driver``) of a database, for ``tracking.uri``."""

_CONNECT_TIMEOUT_S = 10
_TRACKING_TIMEOUT_S = 5

TRACKING_CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}
"""MLflow's HTTP client settings for a tracking server, where the user set none: MLflow's own
(7 retries, backoff factor 2, 120 s timeout) make one call to a server that went away wait for
minutes; these, about 3 s when it refuses connections, about a minute when it hangs."""


def mask_credentials(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` in it as ``***``."""
    return _CREDENTIALS.sub(lambda m: m["head"] + MASK, text)


def hide_url(url: str) -> str:
    """``url`` with its password as ``***``: SQLAlchemy's rendering (``hide_password``) for a
    database URL, the same for any other (``http://user:pw@host``); unchanged without one."""
    if "@" not in url:
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if urlsplit(url).scheme.split("+")[0] in _DB_SCHEMES:
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError):
            return mask_credentials(url)
        if parsed.password is None:
            return url
        return parsed.render_as_string(hide_password=True)
    return mask_credentials(url)


def error_line(exc: BaseException) -> str:
    """The first line of what a database driver or HTTP client said, the URL's password hidden."""
    orig = getattr(exc, "orig", None)  # SQLAlchemy's DBAPIError: the driver's own message
    text = str(orig if orig is not None else exc).strip()
    errno = re.search(r"\[Errno -?\d+\] [^'\")\]]+", text)  # urllib3's long retry message
    line = errno[0] if errno else (text.splitlines() or [type(exc).__name__])[0]
    return mask_credentials(line)[:300]


def missing_sqlite(url: str) -> bool:
    """Whether ``url`` names a SQLite file that does not exist: opening it would create it."""
    return url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file()


def check_database(url: str, what: str) -> None:
    """Connect once to the database at ``url`` (``what`` names its setting), in 10 s at most;
    for SQLite, create the file's folder. Raises :class:`StorageError` (one line) when it cannot
    be reached."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError
    from sqlalchemy.pool import NullPool

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise StorageError(f"{what} {hide_url(url)!r} is not a database URL: {exc}") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        _check_sqlite(parsed.database, url, what)
        return
    connect_args: dict[str, Any] = {}
    if backend in ("postgresql", "mysql"):
        connect_args["connect_timeout"] = _CONNECT_TIMEOUT_S
    try:
        engine = create_engine(parsed, poolclass=NullPool, connect_args=connect_args)
    except (SQLAlchemyError, ImportError) as exc:
        raise StorageError(f"cannot open {what} {hide_url(url)}: {error_line(exc)}") from exc
    try:
        with engine.connect():
            pass
    except (SQLAlchemyError, OSError) as exc:
        raise StorageError(f"cannot reach {what} {hide_url(url)}: {error_line(exc)}") from exc
    finally:
        engine.dispose()


def _check_sqlite(database: str | None, url: str, what: str) -> None:
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(
            f"cannot create the folder of {what} {url}: {exc.strerror or exc}; set {what} "
            "(or run from a writable directory)"
        ) from exc
    target = path if path.exists() else path.parent
    if not os.access(target, os.W_OK):
        raise StorageError(
            f"{what} {url}: {target} is not writable; set {what} (or run from a writable directory)"
        )


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_tracking(uri: str) -> None:
    """Reach the MLflow tracking store ``uri`` once: a tracking server (``http(s)://``) asked
    without retries (MLflow's own retry for minutes), a database URL connected to; a local
    folder needs nothing. Raises :class:`StorageError` (one line) when it does not answer."""
    scheme = urlsplit(uri).scheme.split("+")[0]
    if scheme in _DB_SCHEMES:
        check_database(uri, "tracking.uri")
        return
    if scheme not in ("http", "https"):
        return
    from mlflow import MlflowClient

    with _environ(
        MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
        MLFLOW_HTTP_REQUEST_TIMEOUT=str(_TRACKING_TIMEOUT_S),
    ):
        try:
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except Exception as exc:  # MlflowException, requests' errors: the server did not answer
            raise StorageError(
                f"cannot reach the MLflow tracking server {hide_url(uri)}: {error_line(exc)}; "
                "start it, or run without tracking (tracking=none)"
            ) from exc


def quick_tracking_retries(uri: str) -> dict[str, str]:
    """For a tracking server (``http(s)://``): :data:`TRACKING_CLIENT_DEFAULTS` in this process's
    environment, each where it is not set already (MLflow reads them at each request), and
    urllib3's retry warnings for MLflow's calls left out. Returns the variables set."""
    if urlsplit(uri).scheme not in ("http", "https"):
        return {}
    done = {k: v for k, v in TRACKING_CLIENT_DEFAULTS.items() if k not in os.environ}
    os.environ.update(done)
    pool = logging.getLogger("urllib3.connectionpool")
    if _quiet_mlflow_retries not in pool.filters:
        pool.addFilter(_quiet_mlflow_retries)
    return done


def _quiet_mlflow_retries(record: logging.LogRecord) -> bool:
    """urllib3's ``Retrying (...)`` warning for an MLflow REST call: dropped (a call that
    fails after its retries is the tracker's one line)."""
    return "/api/2.0/mlflow" not in record.getMessage()


class RunDirCheck(Callback):
    """Hydra callback: create the run folder (``hydra.run.dir``) before Hydra does; when that
    fails (a read-only working directory) print one line and exit 1, not Hydra's traceback."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        run_dir = Path(str(config.hydra.run.dir))
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            sys.stderr.write(
                f"error: cannot create the run folder {run_dir}: {exc.strerror or exc}; run "
                "from a writable directory or set hydra.run.dir\n"
            )
            sys.exit(1)
