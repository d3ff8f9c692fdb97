"""Where a start-up's time went, from the server log's timestamps, and what the compile cache did.

vLLM 0.24 stamps every line to the second (``(EngineCore pid=1496) INFO 11-30 21:43:07
[backends.py:1089] ...``, local time, no year). The marks below are vLLM 0.24.0's own lines
(``https://github.com/vllm-project/vllm/blob/v0.24.0/<file>``); the simulator prints the same ones.
A phase runs from the previous mark to its own; the launch and /health's first 200 are the
launcher's clocks (wall time, so they compare with the log's stamps).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from tuner.records import StartupFacts

__all__ = ["MARKS", "PHASES", "compile_cache_facts", "log_time", "startup_facts"]

# (phase, the line that ends it); the phases in start-up order
MARKS: tuple[tuple[str, re.Pattern[str] | None], ...] = (
    ("process", None),  # launch → the log's first stamped line: process start, Python imports
    # → EngineCore's first line (core.py:114): the API server's config, the engine's spawn
    ("api", re.compile(r"Initializing a V1 LLM engine")),
    ("load", re.compile(r"Model loading took")),  # model_runner.py:302
    ("compile", re.compile(r"torch\.compile (?:took|takes) [\d.]+ s in total")),  # monitor.py:53
    # profiling run, KV cache sizing (gpu_worker.py:508)
    ("kv", re.compile(r"Available KV cache memory|GPU KV cache size")),
    ("graphs", re.compile(r"Graph capturing finished")),  # model_runner.py:726
    ("warmup", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    ("ready", None),  # → /health 200: the API server's routes, its socket
)
PHASES: tuple[str, ...] = tuple(name for name, _ in MARKS)

_STAMP = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
_CACHE_DIR = re.compile(r"Using cache directory: (\S+) for vLLM's torch\.compile")  # L1089
_AOT_LOAD = re.compile(r"Directly load AOT compilation from path (\S+)")  # decorators.py:312
_AOT_SAVE = re.compile(r"saved AOT compiled function to (\S+)")  # decorators.py:708
_GRAPH_LOAD = re.compile(r"Directly load the compiled graph\(s\) for compile range")  # L293
_GRAPH_COMPILE = re.compile(r"Compiling a graph for compile range")  # backends.py:393
_HASH_AFTER = re.compile(r"torch_compile_cache/(?:torch_aot_compile/)?([0-9a-f]+)/")


def log_time(line: str, year: int) -> float | None:
    """The epoch seconds of a line's stamp (local time, as vLLM writes it), None if unstamped."""
    m = _STAMP.search(line)
    if not m:
        return None
    mon, day, hh, mm, ss = (int(g) for g in m.groups())
    return time.mktime((year, mon, day, hh, mm, ss, 0, 0, -1))


def _hash(path: str) -> str | None:
    m = _HASH_AFTER.search(path)
    return m.group(1) if m else None


def compile_cache_facts(lines: Sequence[str]) -> tuple[str | None, str | None, str | None]:
    """``(compile_cache, compile_hash, aot_hash)``: ``hit`` when a compiled artifact was loaded
    and nothing compiled, ``miss`` when something compiled, None when the log shows neither."""
    loaded = compiled = False
    compile_hash = aot_hash = None
    for line in lines:
        if compile_hash is None and (m := _CACHE_DIR.search(line)):
            compile_hash = _hash(m.group(1))
        elif m := _AOT_LOAD.search(line):
            loaded, aot_hash = True, aot_hash or _hash(m.group(1))
        elif m := _AOT_SAVE.search(line):
            compiled, aot_hash = True, aot_hash or _hash(m.group(1))
        elif _GRAPH_LOAD.search(line):
            loaded = True
        elif _GRAPH_COMPILE.search(line):
            compiled = True
    state = "miss" if compiled else "hit" if loaded else None
    return state, compile_hash, aot_hash


def startup_facts(lines: Sequence[str], launched_at: float, ready_at: float) -> StartupFacts:
    """The phases between ``launched_at`` and ``ready_at`` (epoch seconds), and the compile
    cache's facts. Stamps have one-second resolution: a mark is never earlier than the one
    before it (nor than the launch), nor later than ready."""
    year = time.localtime(launched_at).tm_year
    marks: dict[str, float] = {}
    first: float | None = None
    for line in lines:
        t = log_time(line, year)
        if t is None:
            continue
        first = t if first is None else first
        for name, pattern in MARKS:
            if pattern is not None and name not in marks and pattern.search(line):
                marks[name] = t
    if first is not None:
        marks["process"] = first
    marks["ready"] = ready_at
    phases: dict[str, float] = {}
    prev = launched_at
    for name in PHASES:
        if name not in marks:
            continue
        t = min(max(marks[name], prev), ready_at)
        phases[name] = round(t - prev, 3)
        prev = t
    state, compile_hash, aot_hash = compile_cache_facts(lines)
    return StartupFacts(
        phases=phases, compile_cache=state, compile_hash=compile_hash, aot_hash=aot_hash
    )
