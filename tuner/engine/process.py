"""Stage 3 — the server process: one lifecycle for ``vllm serve`` and the simulator.

``Server`` starts an argv list (never a shell) in its own session/process group on a free
loopback port, logs to a file, and is ready at the first ``GET /health`` == 200 while it watches
both the process and every new log line: a fatal line (as :mod:`tuner.engine.logparse` classes
it) fails the launch at once.
Stopping sends SIGTERM to the whole group, waits, then SIGKILLs it, and checks through /proc that no
member survived. A registry of live groups is killed on interpreter exit and on SIGTERM, so a
dying tuner leaves no server behind.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import aiohttp

from tuner.config import EngineConfig
from tuner.engine.logparse import classify, is_fatal, parse_facts, strip_prefix
from tuner.engine.preload import ForkedProcess, PreloadError, fork_server, stop_all, turn_off
from tuner.engine.startup_log import startup_facts
from tuner.errors import EngineError, FailureReason, LaunchFailed, ReplayFailed
from tuner.records import LaunchInfo

__all__ = ["Preload", "Server", "free_port", "group_members", "kill_all_groups", "proc_table"]

log = logging.getLogger(__name__)

_LIVE_GROUPS: set[int] = set()
PROGRESS_EVERY_S = 15.0


def kill_all_groups() -> None:
    """SIGKILL every process group this tuner started and has not stopped (exit/signal path),
    and end the zygotes of ``engine.preload``. A Ctrl-C while they end (on 2026-12-07 `timeout`'s
    SIGINT reached a finished run here, a traceback in its log) ends the rest at once."""
    while True:
        try:
            stop_all()
            break
        except KeyboardInterrupt:  # that zygote was killed; the others still end
            continue
    for pgid in list(_LIVE_GROUPS):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        _LIVE_GROUPS.discard(pgid)


atexit.register(kill_all_groups)


_RECENT_PORTS: collections.deque[int] = collections.deque(maxlen=256)


def free_port(host: str = "127.0.0.1") -> int:
    """A free loopback port, not one handed out recently (parallel trials bind theirs later)."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _RECENT_PORTS:
            break
    _RECENT_PORTS.append(port)
    return port


def proc_table() -> dict[int, tuple[int, int]]:
    """Every live (non-zombie) process: pid -> (ppid, pgid), read from /proc."""
    out: dict[int, tuple[int, int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces/parens: split after the last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[0] not in ("Z", "X"):
            out[int(d.name)] = (int(fields[1]), int(fields[2]))
    return out


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``, read from /proc."""
    return sorted(pid for pid, (_, group) in proc_table().items() if group == pgid)


@dataclasses.dataclass(frozen=True)
class Preload:
    """``engine.preload``: fork the server from a zygote that imported ``modules``
    (:mod:`tuner.engine.preload`), which logs to ``zygote_log``; ``per_launch``: variables of
    the environment that differ between launches of one zygote."""

    modules: tuple[str, ...]
    zygote_log: Path
    per_launch: tuple[str, ...] = ("CUDA_VISIBLE_DEVICES",)
    silent_s: float = 60.0
    """A forked server that writes nothing to its log for this long is taken as hung (a fork
    of a multi-threaded interpreter can deadlock in the child): it is stopped and started as a
    process, and no more servers are forked in this run. A forked vLLM 0.24.0 server logged
    its first line within a second on the H200; `vllm serve` started as a process took 15-28 s
    to its first line, imports included."""

    @classmethod
    def of(cls, engine: EngineConfig, zygote_log: Path, *per_launch: str) -> Preload:
        """``engine.preload_modules``' zygote; ``per_launch``: variables set per launch besides
        ``CUDA_VISIBLE_DEVICES`` (the GPU lease)."""
        modules = tuple(engine.preload_modules)
        return cls(modules, zygote_log, ("CUDA_VISIBLE_DEVICES", *per_launch))


_FELL_BACK: set[str] = set()


class Server:
    """An engine server process. Use ``async with Server(...) as info:``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        host: str,
        port: int,
        startup_timeout_s: float,
        stop_timeout_s: float = 15.0,
        health_interval_s: float = 0.5,
        cpus: Sequence[int] | None = None,
        preload: Preload | None = None,
    ) -> None:
        self.argv = list(argv)
        self.preload = preload
        self.cpus = sorted(cpus) if cpus else None
        """CPU cores the server's process tree is pinned to (None: not pinned)."""
        self.env = dict(env)
        self.log_path = log_path
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.health_interval_s = health_interval_s
        self.proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        self.pgid: int | None = None
        self.ready = False
        self.stop_s: float | None = None
        self._t_start: float | None = None
        self._t_end: float | None = None
        self.survivors: list[int] = []
        self._log_pos = 0
        self._lines: list[str] = []
        self._partial = ""

    @property
    def lifetime_s(self) -> float:
        """Seconds from launch to the end of teardown (so far, if still running)."""
        if self._t_start is None:
            return 0.0
        return round((self._t_end or time.monotonic()) - self._t_start, 3)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- log --------------------------------------------------------------------------------

    def _read_new_lines(self) -> list[str]:
        try:
            with self.log_path.open("r", encoding="utf-8", errors="replace") as f:
                f.seek(self._log_pos)
                chunk = f.read()
                self._log_pos = f.tell()
        except FileNotFoundError:
            return []
        if not chunk:
            return []
        text = self._partial + chunk
        parts = text.split("\n")
        self._partial = parts.pop()
        new = [p.rstrip("\r") for p in parts]
        self._lines += new
        return new

    def log_lines(self) -> list[str]:
        self._read_new_lines()
        return self._lines + ([self._partial] if self._partial else [])

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> LaunchInfo:
        """Launch and wait until ready. Raises :class:`LaunchFailed` with a classified reason."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = self._t_start = time.monotonic()
        launched_at = time.time()  # wall clock: the log's stamps are wall times
        forked = await self._forked() if self.preload else None
        proc = self._started(forked)
        t_proc = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=2.0)
        next_note = t0 + PROGRESS_EVERY_S
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                if self._hung(t_proc):
                    proc = await self._restarted()
                if time.monotonic() >= next_note:  # long real starts: say what vLLM is doing
                    next_note += PROGRESS_EVERY_S
                    last = next((strip_prefix(x) for x in reversed(self._lines) if x.strip()), "")
                    log.info("  starting: %.0f s; log: %s", time.monotonic() - t0, last[:120])
                fatal = [ln for ln in self._read_new_lines() if is_fatal(ln)]
                if fatal:
                    # let the traceback finish (pydantic prints the details under the line)
                    await asyncio.sleep(0.5)
                    raise self._failed()
                if proc.poll() is not None:
                    raise self._failed()
                elapsed = time.monotonic() - t0
                if elapsed > self.startup_timeout_s:
                    raise LaunchFailed(
                        FailureReason.STARTUP_TIMEOUT,
                        f"no /health 200 within {self.startup_timeout_s:.0f} s",
                    )
                if await self._health(http) == 200:
                    break
                await asyncio.sleep(self.health_interval_s)
            startup_s = time.monotonic() - t0
            ready_at = launched_at + startup_s
            version = await self._version(http)
        self.ready = True
        lines = self.log_lines()
        facts = parse_facts(lines)
        return LaunchInfo(
            port=self.port,
            pid=proc.pid,
            startup_s=round(startup_s, 3),
            facts=dataclasses.replace(facts, engine_version=version or facts.engine_version),
            startup=startup_facts(lines, launched_at, ready_at),
            preloaded=True if isinstance(proc, ForkedProcess) else None,
        )

    def _started(self, forked: ForkedProcess | None) -> subprocess.Popen[bytes] | ForkedProcess:
        """The server's process: ``forked``, else a new one in its own session, logging to
        ``log_path``; pinned to ``cpus``."""
        proc: subprocess.Popen[bytes] | ForkedProcess
        if forked is not None:
            proc = forked
        else:
            with self.log_path.open("wb") as logf:
                try:
                    proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once
                        self.argv,
                        stdin=subprocess.DEVNULL,
                        stdout=logf,
                        stderr=subprocess.STDOUT,
                        env=self.env,
                        start_new_session=True,
                    )
                except OSError as exc:
                    raise EngineError(f"cannot start {self.argv[0]!r}: {exc.strerror}") from exc
        self.proc = proc
        self.pgid = proc.pid  # start_new_session: the child leads its own group
        _LIVE_GROUPS.add(self.pgid)
        if self.cpus:  # before the server forks its workers (vLLM imports for seconds first)
            try:
                os.sched_setaffinity(proc.pid, self.cpus)
            except OSError as exc:
                log.warning("could not pin pid %s to CPUs %s: %s", proc.pid, self.cpus, exc)
        log.debug("started pid %s: %s", proc.pid, " ".join(self.argv))
        return proc

    def _hung(self, t_proc: float) -> bool:
        """A forked server that has written nothing since ``t_proc``, for ``silent_s``."""
        return (
            isinstance(self.proc, ForkedProcess)
            and self.preload is not None
            and not self._lines
            and not self._partial
            and time.monotonic() - t_proc > self.preload.silent_s
        )

    async def _restarted(self) -> subprocess.Popen[bytes] | ForkedProcess:
        """Stop a hung forked server, fork no more in this run, and start it as a process; its
        start-up time keeps the seconds lost."""
        assert self.preload is not None
        why = (
            f"a forked server wrote nothing in {self.preload.silent_s:.0f} s (a fork of a "
            "multi-threaded interpreter can deadlock)"
        )
        log.warning("engine.preload: %s; starting it and every later server as a process", why)
        _FELL_BACK.add(why)  # said here; the later launches fall back without saying it again
        turn_off(why)
        await self.stop()
        self._t_end = self.stop_s = None
        self.survivors = []
        return self._started(None)

    async def _forked(self) -> ForkedProcess | None:
        """The server forked from its zygote (the first launch waits for the zygote's imports,
        in a thread), or None where it cannot be: then a process is started, as without
        ``engine.preload``, and the reason is logged once."""
        assert self.preload is not None
        self.log_path.open("wb").close()  # the child appends
        try:
            return await asyncio.to_thread(
                fork_server,
                self.argv,
                self.env,
                self.log_path,
                modules=self.preload.modules,
                zygote_log=self.preload.zygote_log,
                timeout_s=self.startup_timeout_s,
                per_launch=self.preload.per_launch,
                cpus=self.cpus,
            )
        except PreloadError as exc:
            if str(exc) not in _FELL_BACK:
                _FELL_BACK.add(str(exc))
                log.warning("engine.preload: %s; starting each server as a process", exc)
            return None

    def _failed(self) -> LaunchFailed:
        reason, detail = classify(self.log_lines())
        code = self.proc.poll() if self.proc else None
        if reason is FailureReason.CRASH and code is not None:
            detail = f"exit code {code}: {detail}"
        return LaunchFailed(reason, detail)

    async def _health(self, http: aiohttp.ClientSession) -> int | None:
        try:
            async with http.get(f"{self.base_url}/health") as r:
                return r.status
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None

    async def _version(self, http: aiohttp.ClientSession) -> str | None:
        try:
            async with http.get(f"{self.base_url}/version") as r:
                if r.status == 200:
                    v = (await r.json()).get("version")
                    return str(v) if v else None
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            pass
        return None

    async def check(self, http: aiohttp.ClientSession) -> None:
        """After ready: raise :class:`ReplayFailed` (``ENGINE_DEAD``, or ``CUDA_OOM`` when the log
        says so, with the evidence line) if the engine died; return if it is alive."""
        new = self._read_new_lines()
        dead_line = any("EngineCore encountered a fatal error" in ln for ln in new)
        exited = self.proc is not None and self.proc.poll() is not None
        if dead_line or exited or await self._health(http) == 503:
            reason, detail = classify(self.log_lines(), after_ready=True)
            if reason is not FailureReason.CUDA_OOM:
                reason = FailureReason.ENGINE_DEAD
            raise ReplayFailed(reason, detail)

    async def stop(self) -> None:
        """SIGTERM the group, wait ``stop_timeout_s``, SIGKILL; then verify nothing survived."""
        if self.proc is None or self.pgid is None:
            return
        t0 = time.monotonic()
        pgid = self.pgid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        # A server that never became ready has nothing to drain (and vLLM 0.24 may hang in its
        # failed-start cleanup, seen on the H200): give it a moment, then SIGKILL.
        grace = self.stop_timeout_s if self.ready else min(self.stop_timeout_s, 2.0)
        deadline = t0 + grace
        while time.monotonic() < deadline:
            self.proc.poll()
            if not group_members(pgid):
                break
            await asyncio.sleep(0.1)
        else:
            log.warning("server group %s still alive after SIGTERM; sending SIGKILL", pgid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for _ in range(50):
            self.survivors = group_members(pgid)
            if not self.survivors:
                break
            await asyncio.sleep(0.1)
        _LIVE_GROUPS.discard(pgid)
        self._t_end = time.monotonic()
        self.stop_s = round(self._t_end - t0, 3)
        if self.survivors:
            log.error("processes %s of server group %s survived SIGKILL", self.survivors, pgid)
        self._read_new_lines()

    async def __aenter__(self) -> LaunchInfo:
        try:
            return await self.start()
        except BaseException:
            await asyncio.shield(self.stop())
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.shield(self.stop())
