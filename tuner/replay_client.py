"""One replay client process's machinery: the :class:`Runner` that sends each request and measures
it, and what runs around it. :func:`tuner.replay.replay` uses it in the tuner's process, and each
client process of :mod:`tuner.replay_procs` in its own.

Measurements follow ``vllm bench serve`` (``time.perf_counter``, streaming with usage):

* TTFT: send -> first SSE chunk carrying generated text (role-only chunks do not count);
* ITL: gaps between consecutive content chunks (one sample per chunk);
* E2E: send -> the last content-or-usage chunk;
* token counts from the final ``usage`` chunk (fallback: number of content chunks).

A chunk's time is when the read that delivered it returned: each read takes every byte that has
arrived and its lines are parsed with one ``json.loads`` each (no per-line await), so the
client adds little latency (``benchmarks/client_capacity.py`` measures how much).

Failed requests are records with ``status="error"``/``"timeout"``, never exceptions.

Around the runner: the request body as sent (:func:`encode_body`), the connection pool
(:func:`client_session`), the ``on_record`` guard (:class:`Guarded`), the send and return orders
(:func:`arrival_order`, :func:`record_order`), the client's event loop (:func:`loop_factory`,
:data:`CLIENT_LOOPS`) and what the client itself costs (:class:`LagProbe`, :class:`ClientStats`).

While a replay runs, Python's garbage collector collects only its youngest generation
(:func:`gc_paused`): a full collection walks every object of the process (the tuner's holds
Optuna, MLflow and SQLAlchemy) and stalls the event loop for 50-150 ms, which lands on whatever
chunks were arriving: the tail of TTFT and ITL.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

import aiohttp
import numpy as np

from tuner.aio import cancel_and_wait
from tuner.errors import ConfigError
from tuner.records import RequestRecord, RequestSpec

__all__ = [
    "CLIENT_LOOPS",
    "LAG_INTERVAL_S",
    "UVLOOP_MISSING",
    "ClientStats",
    "Guarded",
    "LagProbe",
    "Runner",
    "arrival_order",
    "client_session",
    "encode_body",
    "error_message",
    "gc_paused",
    "loop_factory",
    "record_order",
]

log = logging.getLogger(__name__)

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_MAX_ERROR_CHARS = 300
_raw_decode = json.JSONDecoder().raw_decode

_OUT_OF_REACH = 1 << 30
"""The older generations' collection thresholds while replays run: never reached."""
_gc_state: dict[str, Any] = {"depth": 0, "saved": None, "froze": False}


LAG_INTERVAL_S = 0.01
"""How often the lag probe wakes while measured requests run."""


@dataclass
class ClientStats:
    """What the replay client itself cost during the measured requests;
    ``tuner.replay.replay(stats=...)`` fills it.

    ``lag_s``: how late the lag probe's timer fired, every :data:`LAG_INTERVAL_S`, in every
    client process: a chunk that arrived while the loop was busy waited about that long before
    the client read it and stamped its time. (Timers fire on the loop's poll, whose timeout is
    rounded to milliseconds: an idle loop shows up to ~1 ms.) ``at_s``: when each sample was
    taken (``time.perf_counter``, one clock for every process on the host). ``cpu_s``: CPU
    seconds of each client process over ``wall_s`` (with one process, that is the tuner's whole
    process).
    """

    lag_s: list[float] = field(default_factory=list)
    at_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def add(
        self, lag_s: Sequence[float], cpu_s: float, wall_s: float, at_s: Sequence[float] = ()
    ) -> None:
        """One client process's probe: its lag samples (taken at ``at_s``), CPU seconds and
        wall seconds (the longest process's wall time is kept)."""
        self.lag_s.extend(lag_s)
        self.at_s.extend(at_s if len(at_s) == len(lag_s) else [float("nan")] * len(lag_s))
        self.cpu_s.append(cpu_s)
        self.wall_s = max(self.wall_s, wall_s)

    def max_within(self, start: float, end: float) -> float | None:
        """The longest lag of a sample taken between ``start`` and ``end`` (perf_counter
        seconds), ms; None without such a sample."""
        inside = [lag for lag, t in zip(self.lag_s, self.at_s, strict=True) if start <= t <= end]
        return max(inside) * 1e3 if inside else None

    def summary(self) -> dict[str, float]:
        """``client_lag_p99_ms``, ``client_lag_max_ms``, ``client_cpu_max`` (the busiest client
        process's share of one core); keys absent without samples."""
        out: dict[str, float] = {}
        if self.lag_s:
            out["client_lag_p99_ms"] = float(np.percentile(self.lag_s, 99)) * 1e3
            out["client_lag_max_ms"] = max(self.lag_s) * 1e3
        if self.cpu_s and self.wall_s > 0:
            out["client_cpu_max"] = max(self.cpu_s) / self.wall_s
        return out


class LagProbe:
    """``async with LagProbe() as probe``: how late a timer fires, every ``interval_s``, on
    this event loop, and this process's CPU seconds, inside the block."""

    def __init__(self, interval_s: float = LAG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.lag_s: list[float] = []
        self.at_s: list[float] = []
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self._task: asyncio.Task[None] | None = None
        self._cpu0 = self._t0 = 0.0

    async def _run(self) -> None:
        clock = asyncio.get_running_loop().time
        while True:
            due = clock() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.lag_s.append(max(0.0, clock() - due))
            self.at_s.append(time.perf_counter())

    async def __aenter__(self) -> LagProbe:
        self._cpu0, self._t0 = time.process_time(), time.perf_counter()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task is not None
        await cancel_and_wait(self._task)
        self.cpu_s = time.process_time() - self._cpu0
        self.wall_s = time.perf_counter() - self._t0


CLIENT_LOOPS = ("asyncio", "uvloop")
UVLOOP_MISSING = (
    "workload.client_loop is uvloop, which is not installed; "
    "pip install 'tuner[fast]' (or uvloop), or use workload.client_loop=asyncio"
)


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event-loop factory for ``workload.client_loop`` (None: asyncio's default), for
    ``asyncio.Runner(loop_factory=...)``; :func:`tuner.replay.check` calls it too. Raises
    ConfigError for a name not in :data:`CLIENT_LOOPS`, and for uvloop when it is missing."""
    if name == "asyncio":
        return None
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            raise ConfigError(UVLOOP_MISSING) from None
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    raise ConfigError(f"workload.client_loop is {name!r}; allowed: {', '.join(CLIENT_LOOPS)}")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Only the youngest generation is collected inside the block; nestable (trials of several
    workers replay at once in one event loop: the first to enter pauses, the last to leave
    restores).

    Everything alive on entry is frozen (``gc.freeze``: moved out of the collector's sight, at no
    cost; objects the process froze itself are left as they are) and the older generations'
    thresholds are set out of reach. Measured in a process that imported the tuner's stack
    (``benchmarks/client_capacity.py --tuner-heap``, 2-core VM): a full collection took 45-145 ms
    and a middle-generation one up to 17 ms, each a stall of the event loop; the youngest
    generation's (at most ~700 new objects) are short. Cyclic garbage that outlives a young
    collection waits for the first collection after the block: a replay of 3,000 requests left
    5,000-7,000 such objects. On leaving, the thresholds are restored and the frozen objects
    handed back to the collector; nothing is collected then. From Python 3.14 the collector is
    incremental (no full stalls), and only the freeze applies.
    """
    st = _gc_state
    if st["depth"] == 0:
        # objects frozen by someone else: theirs to thaw (unfreeze would thaw all of them)
        st["froze"] = gc.get_freeze_count() == 0
        if st["froze"]:
            gc.freeze()
        if sys.version_info < (3, 14):
            t0, t1, t2 = gc.get_threshold()
            st["saved"] = (t0, t1, t2)
            gc.set_threshold(t0, _OUT_OF_REACH, _OUT_OF_REACH)
    st["depth"] += 1
    try:
        yield
    finally:
        st["depth"] -= 1
        if st["depth"] == 0:
            if st["saved"] is not None:
                gc.set_threshold(*st["saved"])
                st["saved"] = None
            if st["froze"]:
                gc.unfreeze()


def error_message(payload: Any, fallback: str) -> str:
    """The server's message from a vLLM/OpenAI error body (``{"error": {"message": ...}}``,
    ``{"message": ...}`` or ``{"detail": ...}``), else ``fallback``."""
    if isinstance(payload, dict):
        err = payload.get("error", payload)
        if isinstance(err, dict):
            for key in ("message", "detail"):
                if err.get(key):
                    return str(err[key])[:_MAX_ERROR_CHARS]
        elif err:
            return str(err)[:_MAX_ERROR_CHARS]
    return fallback[:_MAX_ERROR_CHARS]


_DRAIN_S = 1.0
"""How long to wait for the end of a response body after its ``[DONE]`` event."""


def encode_body(spec: RequestSpec, model: str) -> bytes:
    """The request body as sent: the spec's body plus model, streaming and usage."""
    body = {
        **spec.body,
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(body).encode()


def client_session(limit: int, request_timeout_s: float) -> aiohttp.ClientSession:
    """The client session: ``limit`` connections at most (0: no limit), kept alive."""
    connector = aiohttp.TCPConnector(limit=limit, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(request_timeout_s, 30.0))
    return aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=2**18)


class Guarded:
    """Calls ``on_record``; a failing callback is logged once and never stops the replay (a
    broken progress display must not break the measurement)."""

    def __init__(self, on_record: Callable[[RequestRecord], None] | None) -> None:
        self.on_record = on_record
        self._failed = False

    def __call__(self, record: RequestRecord) -> None:
        if self.on_record is None:
            return
        try:
            self.on_record(record)
        except Exception:
            if not self._failed:
                log.exception("on_record callback failed; further failures are not logged")
            self._failed = True


class Runner:
    """The replay's client: sends each request on ``session``, measures it and records it
    (:meth:`send`); one per replay, in this process or in each client process
    (:mod:`tuner.replay_procs`)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        model: str,
        request_timeout_s: float,
        headers: dict[str, str],
        on_record: Callable[[RequestRecord], None] | None,
    ) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.request_timeout_s = request_timeout_s
        self.headers = headers
        self.on_record = Guarded(on_record)
        self.records: list[RequestRecord] = []

    def _done(self, record: RequestRecord) -> None:
        self.records.append(record)
        self.on_record(record)

    async def send(self, spec: RequestSpec, t0: float, data: bytes | None = None) -> None:
        """Send one request and record what happened; ``t0`` is the replay start. ``data`` is
        the encoded body if the caller has it already (:func:`encode_body` of ``spec``)."""
        if data is None:
            data = encode_body(spec, self.model)
        url = self.base_url + _PATHS[spec.endpoint]
        sent = time.perf_counter()
        state: dict[str, Any] = {
            "ttft": None,
            "last": None,
            "itl": [],
            "chunks": 0,
            "usage": None,
            "end": None,
        }
        try:
            async with asyncio.timeout(self.request_timeout_s):
                record = await self._stream(spec, url, data, sent, t0, state)
        except TimeoutError:
            record = self._partial(
                spec, sent, t0, state, "timeout", f"no completion in {self.request_timeout_s} s"
            )
        except aiohttp.ClientError as exc:
            record = self._partial(spec, sent, t0, state, "error", f"{type(exc).__name__}: {exc}")
        except (OSError, ValueError) as exc:  # socket errors, malformed stream lines
            record = self._partial(spec, sent, t0, state, "error", f"{type(exc).__name__}: {exc}")
        self._done(record)

    def _partial(
        self,
        spec: RequestSpec,
        sent: float,
        t0: float,
        state: dict[str, Any],
        status: Literal["error", "timeout"],
        error: str,
        http_status: int | None = None,
    ) -> RequestRecord:
        return RequestRecord(
            index=spec.index,
            status=status,
            t_sent_s=sent - t0,
            ttft_s=state["ttft"],
            itl_s=tuple(state["itl"]),
            http_status=http_status,
            error=error[:_MAX_ERROR_CHARS],
            warmup=spec.warmup,
        )

    async def _stream(
        self,
        spec: RequestSpec,
        url: str,
        data: bytes,
        sent: float,
        t0: float,
        state: dict[str, Any],
    ) -> RequestRecord:
        async with self.session.post(url, data=data, headers=self.headers) as resp:
            if resp.status != 200:
                text = await resp.text(errors="replace")
                try:
                    payload: Any = json.loads(text)
                except ValueError:
                    payload = None
                msg = error_message(payload, text or resp.reason or f"HTTP {resp.status}")
                return self._partial(spec, sent, t0, state, "error", msg, resp.status)
            error = await self.read_stream(resp.content, sent, state)
            if error is not None:
                return self._partial(spec, sent, t0, state, "error", error, 200)
            if state["ttft"] is None:
                return self._partial(
                    spec, sent, t0, state, "error", "stream ended without generated text", 200
                )
            usage: dict[str, Any] | None = state["usage"]
            prompt_tokens = output_tokens = None
            if usage is not None:
                prompt_tokens = usage.get("prompt_tokens")
                output_tokens = usage.get("completion_tokens")
            if output_tokens is None:
                output_tokens = state["chunks"]
            last_event: float | None = state["end"]
            assert last_event is not None
            return RequestRecord(
                index=spec.index,
                status="ok",
                t_sent_s=sent - t0,
                ttft_s=state["ttft"],
                itl_s=tuple(state["itl"]),
                e2e_s=last_event - sent,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                http_status=200,
                warmup=spec.warmup,
            )

    async def read_stream(
        self, content: aiohttp.StreamReader, sent: float, state: dict[str, Any]
    ) -> str | None:
        """Read a 200 response's SSE stream (sent at ``sent``) into ``state``: ``ttft``, ``itl``,
        ``last`` and ``chunks`` of its content chunks, ``usage`` (the usage chunk's) and ``end``
        (the time of the last content or usage chunk). Returns the error that ended it (an error
        chunk, malformed data), or None."""
        itl: list[float] = state["itl"]
        last_event: float | None = None
        usage: dict[str, Any] | None = None
        decode, clock = _raw_decode, time.perf_counter
        tail = b""
        done = False
        # One read returns every byte that has arrived: split it into lines here instead of
        # awaiting a readline per line, and stamp all of its chunks with the read's time.
        while not done:
            data = await content.readany()
            now = clock()
            if data:
                lines = (tail + data if tail else data).split(b"\n")
                tail = lines.pop()
            elif tail:  # the stream ended with a line without a newline
                lines, tail, done = [tail], b"", True
            else:
                break
            for raw in lines:
                if not raw.startswith(b"data:"):
                    continue  # blank separators, comments, event: lines
                payload_bytes = raw[5:].strip()
                if payload_bytes == b"[DONE]":
                    done = True
                    break
                try:  # json.loads minus its encoding sniffing and whitespace regexes
                    text = payload_bytes.decode()
                    chunk, end = decode(text)
                    if end != len(text):
                        raise ValueError("extra data")
                except ValueError:  # JSONDecodeError, UnicodeDecodeError
                    return f"malformed SSE data: {raw[:200]!r}"
                if type(chunk) is not dict:
                    continue
                if "error" in chunk and chunk["error"]:
                    return error_message(chunk, "error chunk in stream")
                choices = chunk.get("choices")
                if choices:
                    c0 = choices[0]
                    text = c0.get("text")
                    if not text:
                        delta = c0.get("delta")
                        if delta:
                            text = (
                                delta.get("content")
                                or delta.get("reasoning_content")
                                or delta.get("reasoning")
                            )
                    if text:
                        if state["ttft"] is None:
                            state["ttft"] = now - sent
                        else:
                            itl.append(now - state["last"])
                        state["last"] = now
                        state["chunks"] += 1
                        last_event = now
                if "usage" in chunk and chunk["usage"]:
                    usage = chunk["usage"]
                    last_event = now
        if done and not content.at_eof():
            # Read the body to its end (chunked encoding's last chunk can come after
            # [DONE]) so the connection goes back to the pool, as vllm bench's client does;
            # left unread, aiohttp closes it and the next request opens a new one, which
            # costs the server's API process work during the measurement.
            try:
                async with asyncio.timeout(_DRAIN_S):
                    while await content.readany():
                        pass
            except TimeoutError:
                pass  # a server that holds the body open: the connection is closed
        state["usage"], state["end"] = usage, last_event
        return None


def arrival_order(spec: RequestSpec) -> tuple[float, int]:
    """Open loop sends in this order."""
    return (spec.arrival_s or 0.0, spec.index)


def record_order(record: RequestRecord) -> tuple[bool, int]:
    """The returned records' order: warm-ups first, then by index."""
    return (not record.warmup, record.index)
