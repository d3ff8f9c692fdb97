"""``engine.preload``: servers forked from a preloaded interpreter instead of started afresh.

`vllm serve` spends 16-28 s on the H200 from its launch to its first log line, most of it Python
importing vLLM, torch and transformers (the start-up's "process" phase,
``tuner.engine.startup_log``), and every trial pays it again. With ``engine.preload`` the first
launch starts one zygote (:mod:`tuner.engine.zygote`) in the engine's own interpreter, which
imports the engine's entry point and ``engine.preload_modules`` once; each launch is then a fork
of it: a server in its own process group, with its own environment, argv and log, as
:class:`tuner.engine.process.Server` would have started it.

This module is the tuner's side: which interpreter and entry point ``engine.command`` runs
(:func:`entry_of`), the zygotes (one per interpreter, entry point, modules and environment less
the per-launch variables), and :class:`ForkedProcess`, the handle a forked server gets in place of
a ``subprocess.Popen`` (its exit code comes from the zygote, its parent).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = [
    "Entry",
    "ForkedProcess",
    "PreloadError",
    "Zygote",
    "entry_of",
    "fork_server",
    "stop_all",
    "zygote_for",
]

log = logging.getLogger(__name__)

ZYGOTE = Path(__file__).with_name("zygote.py")
REPLY_TIMEOUT_S = 30.0

_SCRIPT_IMPORT = re.compile(r"^from ([\w.]+) import ([\w.]+)\s*$", re.M)


class PreloadError(Exception):
    """A zygote could not be started or did not answer; the launch falls back to a process."""


@dataclass(frozen=True)
class Entry:
    """How a command runs in a zygote: the interpreter, the zygote's ENTRY argument and the
    child's ``sys.argv``."""

    python: str
    entry: str
    argv: tuple[str, ...]


def _is_python(program: str) -> bool:
    return re.fullmatch(r"python[\d.]*", Path(program).name) is not None


def entry_of(argv: Sequence[str]) -> Entry | str:
    """The :class:`Entry` of ``argv``, or why it cannot run in a zygote (one line):
    ``python -m MODULE ...`` or a console script (``vllm serve ...``: its ``#!`` interpreter and
    its ``from MODULE import FUNC`` line, as pip writes them)."""
    if not argv:
        return "an empty command"
    program = argv[0]
    if _is_python(program):
        if len(argv) >= 3 and argv[1] == "-m":
            python = shutil.which(program) or program
            return Entry(python, f"-m {argv[2]}", (argv[2], *argv[3:]))
        return f"{program} runs no module (-m)"
    path = shutil.which(program)
    if path is None:
        return f"{program!r} is not found on PATH"
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    first = head.splitlines()[0] if head else ""
    python = first[2:].strip().split(" ")[0] if first.startswith("#!") else ""
    found = _SCRIPT_IMPORT.search(head)
    if not python or not _is_python(python) or found is None:
        return f"{path} is not a Python console script"
    return Entry(python, f"{found.group(1)}:{found.group(2)}", (path, *argv[1:]))


class Zygote:
    """One preloaded interpreter (:mod:`tuner.engine.zygote`) and what it reported."""

    def __init__(
        self, entry: Entry, modules: Sequence[str], env: Mapping[str, str], log_path: Path
    ) -> None:
        self.entry = entry
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as errf:
            try:
                self.proc = subprocess.Popen(
                    [entry.python, str(ZYGOTE), entry.entry, *modules],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=errf,
                    env=dict(env),
                    start_new_session=True,
                )
            except OSError as exc:
                raise PreloadError(f"cannot start {entry.python}: {exc.strerror}") from exc
        self.exits: dict[int, int] = {}
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        self.import_s: float | None = None

    def _read(self, out: IO[bytes]) -> None:
        for line in out:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "exit" in msg:
                self.exits[int(msg["exit"])] = int(msg["code"])
            else:
                self._replies.put(msg)
        self._replies.put({"error": f"the zygote exited (code {self.proc.wait()})"})

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        try:
            msg = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            raise PreloadError(f"the zygote did not answer within {timeout_s:.0f} s") from None
        if "error" in msg:
            raise PreloadError(str(msg["error"]))
        return msg

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the imports are done (raises :class:`PreloadError` on failure)."""
        with self._lock:  # parallel launches: one reads the ready line, the others wait for it
            if self.import_s is None:
                self._ready(self._reply(timeout_s))

    def _ready(self, msg: dict[str, Any]) -> None:
        self.import_s = float(msg.get("import_s", 0.0))
        for failed in msg.get("failed", []):
            log.warning("engine.preload: could not preload %s", failed)
        log.info(
            "engine.preload: %s preloaded in %.1f s (pid %s)",
            self.entry.entry,
            self.import_s,
            msg.get("ready"),
        )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        log_path: Path,
        cpus: Sequence[int] | None = None,
    ) -> int:
        """Fork one server running ``argv`` (its ``sys.argv``), pinned to ``cpus`` from its
        start if given; its pid (it leads its own process group)."""
        request = {
            "argv": list(argv),
            "env": dict(env),
            "cwd": cwd,
            "log": str(log_path),
            "cpus": list(cpus) if cpus else None,
        }
        with self._lock:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
            except OSError as exc:
                raise PreloadError(f"the zygote is gone: {exc}") from exc
            return int(self._reply(REPLY_TIMEOUT_S)["pid"])

    def stop(self) -> None:
        """End the zygote: it SIGKILLs the group of each server it forked that still runs."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
            # a Ctrl-C (or `timeout`'s SIGINT) while it ends: end it at once, then let it through
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            if isinstance(exc, KeyboardInterrupt):
                raise


class ForkedProcess:
    """A server forked by a zygote, with the part of ``subprocess.Popen`` that
    :class:`tuner.engine.process.Server` uses: ``pid``, ``poll()``, ``wait()``."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self.zygote.exits.get(self.pid)
            if code is None and not self.zygote.alive and not _alive(self.pid):
                code = -1  # its parent died first: the code is lost
            self.returncode = code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.05)
        return code


def _alive(pid: int) -> bool:
    """Whether ``pid`` still exists (asked once its zygote is gone: init reaps the orphan)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_ZYGOTES: dict[tuple[Any, ...], Zygote] = {}
_FAILED: dict[tuple[Any, ...], str] = {}
"""Zygotes that failed to start, with why: not tried again in this process."""
_STARTING = threading.Lock()


def _key(
    entry: Entry, modules: Sequence[str], env: Mapping[str, str], per_launch: Sequence[str]
) -> tuple[Any, ...]:
    rest = tuple(sorted((k, v) for k, v in env.items() if k not in per_launch))
    return (entry.python, entry.entry, tuple(modules), rest)


def zygote_for(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    modules: Sequence[str],
    zygote_log: Path,
    timeout_s: float,
    per_launch: Sequence[str] = (),
) -> Zygote:
    """The zygote that forks ``argv`` under ``env`` (one per environment but for
    ``per_launch``: the GPU lease, the trial's lease marker; the zygote starts without them,
    nothing reads them at import), started on first use and ready: blocks for its imports (call
    it from a thread). Raises :class:`PreloadError` with the reason when ``argv`` cannot run in
    one or the zygote fails. ``benchmarks/startup.py`` calls it before its timed launches, so
    none of them waits for the imports."""
    entry = _entry(argv)
    key = _key(entry, modules, env, per_launch)
    return _ready(entry, key, env, modules, zygote_log, timeout_s, per_launch)


def _entry(argv: Sequence[str]) -> Entry:
    """:func:`entry_of`, or :class:`PreloadError` with why ``argv`` cannot run in a zygote."""
    entry = entry_of(argv)
    if isinstance(entry, str):
        raise PreloadError(entry)
    return entry


def _ready(
    entry: Entry,
    key: tuple[Any, ...],
    env: Mapping[str, str],
    modules: Sequence[str],
    zygote_log: Path,
    timeout_s: float,
    per_launch: Sequence[str],
) -> Zygote:
    """The zygote of ``key`` (:func:`_key`), started if there is none alive, once its imports
    are done; a zygote that failed is not tried again."""
    with _STARTING:
        if key in _FAILED:
            raise PreloadError(_FAILED[key])
        zygote = _ZYGOTES.get(key)
        if zygote is None or not zygote.alive:
            base = {k: v for k, v in env.items() if k not in per_launch}
            try:
                zygote = _ZYGOTES[key] = Zygote(entry, modules, base, zygote_log)
            except PreloadError as exc:
                _FAILED[key] = str(exc)
                raise
    try:
        zygote.wait_ready(timeout_s)
    except PreloadError as exc:  # not tried again: each launch would wait for it first
        _FAILED[key] = str(exc)
        _ZYGOTES.pop(key, None)
        zygote.stop()
        raise
    return zygote


def fork_server(
    argv: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    *,
    modules: Sequence[str],
    zygote_log: Path,
    timeout_s: float,
    per_launch: Sequence[str] = (),
    cpus: Sequence[int] | None = None,
) -> ForkedProcess:
    """Fork ``argv`` as a server from its zygote (:func:`zygote_for`: the first launch waits for
    its imports). ``cpus``: the server's cores (``engine.cpu_pinning``), set in the child before
    it runs. Raises :class:`PreloadError` with the reason when ``argv`` cannot run in one or the
    zygote fails; the caller starts a process instead."""
    if _OFF:
        raise PreloadError(_OFF[0])
    entry = _entry(argv)
    key = _key(entry, modules, env, per_launch)
    zygote = _ready(entry, key, env, modules, zygote_log, timeout_s, per_launch)
    try:
        pid = zygote.fork(entry.argv, env, os.getcwd(), log_path, cpus)
    except PreloadError as exc:  # no new launch waits on it; servers it forked run on
        _FAILED[key] = str(exc)
        raise
    return ForkedProcess(zygote, pid)


_OFF: list[str] = []
"""Why no more servers are forked in this run (:func:`turn_off`), or empty."""


def turn_off(reason: str) -> None:
    """Fork no more servers until :func:`stop_all`: :func:`fork_server` raises
    :class:`PreloadError` with ``reason``, so each launch starts a process."""
    if not _OFF:
        _OFF.append(reason)


def stop_all() -> None:
    """End every zygote (at exit, and when a run ends); the next launch may fork again."""
    while _ZYGOTES:  # each leaves the registry before it ends: a Ctrl-C between them loses none
        _, zygote = _ZYGOTES.popitem()
        zygote.stop()
    _FAILED.clear()
    _OFF.clear()


atexit.register(stop_all)
