"""Reading a vLLM 0.24 server log: start-up facts and failure classification.

The texts are vLLM 0.24.0's own (its source, e.g. ``vllm/v1/core/kv_cache_utils.py`` for the
KV-cache errors, https://github.com/vllm-project/vllm/tree/v0.24.0/vllm; and the real server logs
kept under ``docs/gpu-runs/``); the simulator prints the same lines, so one parser serves both
engines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tuner.errors import FailureReason
from tuner.records import LogFacts

__all__ = [
    "FATAL",
    "classify",
    "is_fatal",
    "parse_facts",
    "port_clash",
    "strip_prefix",
]

_PREFIX = re.compile(
    r"^(?:\x1b\[[0-9;]*m)*(?:\([A-Za-z_]+\d* pid=\d+\)\s*)?"
    r"(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+"
    r"\[[^\]]*\]\s*)?"
)


def strip_prefix(line: str) -> str:
    """A log line without vLLM's ``(EngineCore pid=N) INFO 11-30 02:13:05 [file.py:12]`` prefix."""
    return _PREFIX.sub("", line.rstrip()).strip()


def _num(s: str) -> float:
    return float(s.replace(",", ""))


_FACTS: dict[str, re.Pattern[str]] = {
    "kv_cache_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "max_concurrency": re.compile(
        r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"
    ),
    "kv_cache_gib": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    # 0.24 logs "Model loading took 15.27 GiB and 2.15 seconds" (model_runner.py:302), older
    # versions "... GiB memory and ... seconds"
    "model_load": re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds"),
    "graph_capture": re.compile(r"Graph capturing finished in ([\d.]+) secs?, took ([\d.-]+) GiB"),
    "init_engine": re.compile(
        r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s(?:econds)?"
        r"(?: \(compilation: ([\d.]+) s\))?"
    ),
    # 0.24 logs "torch.compile took 20.40 s in total" (compilation/monitor.py:53), older "takes"
    "compile": re.compile(r"torch\.compile (?:took|takes) ([\d.]+) s in total"),
    "max_model_len": re.compile(r"Using max model len (\d+)"),
    "version": re.compile(r"vLLM (?:API )?server version ([0-9][\w.+-]*?),? "),
}


def parse_facts(lines: Sequence[str]) -> LogFacts:
    """Start-up facts from the log. With TP > 1 per-worker lines repeat; the first one wins,
    except the KV size, which vLLM logs once for the whole engine."""
    f: dict[str, Any] = {}  # LogFacts' fields found so far
    for raw in lines:
        line = strip_prefix(raw)
        if "kv_cache_tokens" not in f and (m := _FACTS["kv_cache_tokens"].search(line)):
            f["kv_cache_tokens"] = int(_num(m.group(1)))
        elif "max_concurrency" not in f and (m := _FACTS["max_concurrency"].search(line)):
            f["max_concurrency"] = float(m.group(2))
            f["max_model_len"] = f.get("max_model_len") or int(_num(m.group(1)))
        elif "kv_cache_gib" not in f and (m := _FACTS["kv_cache_gib"].search(line)):
            f["kv_cache_gib"] = float(m.group(1))
        elif "model_load_gib" not in f and (m := _FACTS["model_load"].search(line)):
            f["model_load_gib"], f["model_load_s"] = float(m.group(1)), float(m.group(2))
        elif "graph_capture_s" not in f and (m := _FACTS["graph_capture"].search(line)):
            f["graph_capture_s"], f["graph_capture_gib"] = float(m.group(1)), float(m.group(2))
        elif "init_engine_s" not in f and (m := _FACTS["init_engine"].search(line)):
            f["init_engine_s"] = float(m.group(1))
            if m.group(2):
                f["compile_s"] = float(m.group(2))
        elif "compile_s" not in f and (m := _FACTS["compile"].search(line)):
            f["compile_s"] = float(m.group(1))
        elif (m := _FACTS["max_model_len"].search(line)) and "max_model_len" not in f:
            f["max_model_len"] = int(m.group(1))
        elif "engine_version" not in f and (m := _FACTS["version"].search(line + " ")):
            f["engine_version"] = m.group(1)
    return LogFacts(**f)


# Ordered: the first class whose pattern matches anywhere in the log wins (root causes are
# printed above vLLM's generic "Engine core initialization failed" wrapper).
_CLASSES: list[tuple[FailureReason, re.Pattern[str]]] = [
    (
        FailureReason.GPU_BUSY,
        re.compile(r"Free memory on device .* is less than desired GPU memory utilization"),
    ),
    (
        FailureReason.KV_TOO_SMALL,
        re.compile(
            r"To serve at least one request with the models?'?s? max seq len"
            r"|larger than the maximum number of tokens that can be stored in KV cache"
        ),
    ),
    (
        FailureReason.NO_KV_MEMORY,
        re.compile(r"No available memory for the cache blocks|Cannot auto-fit max_model_len"),
    ),
    (
        FailureReason.CUDA_OOM,
        re.compile(
            r"CUDA out of memory|OutOfMemoryError|Failed to load model - not enough GPU memory"
            r"|out of memory occurred when warming up sampler|CUDA error: out of memory"
        ),
    ),
    (
        FailureReason.INVALID_CONFIG,
        re.compile(
            r"error: unrecognized arguments|error: argument |: error: |ValidationError"
            r"|is greater than the derived max_model_len|must be divisible by tensor parallel size"
            r"|is smaller than max_model_len|must be greater than or equal to max_num_seqs"
            r"|No valid attention backend found|are mutually exclusive"
            r"|Concurrent Partial Prefill is not supported"
            r"|is larger than the number of available GPUs"
            r"|Invalid compilation mode|should be consistent with the max value"
            r"|is not supported with .* backend|Pipeline parallelism is not supported"
        ),
    ),
    (
        FailureReason.STARTUP_TIMEOUT,
        re.compile(r"Timed out waiting for engine core processes to start"),
    ),
    (FailureReason.ENGINE_DEAD, re.compile(r"EngineCore encountered a fatal error")),
]

# Lines after which the server will not become ready: fail the trial at once, do not wait for
# the process to exit or for the start-up timeout.
FATAL = re.compile(
    "|".join(p.pattern for _, p in _CLASSES)
    + r"|Engine core initialization failed|EngineCore failed to start|WorkerProc failed to start"
)


def is_fatal(line: str) -> bool:
    return bool(FATAL.search(line))


# Python's socket error ("[Errno 98] Address already in use", vLLM's HTTP socket) and torch's
# TCPStore ("... name: EADDRINUSE, message: address already in use", the distributed init port)
_PORT_CLASH = re.compile(r"[Aa]ddress already in use|EADDRINUSE")


def port_clash(lines: Sequence[str]) -> bool:
    """A start-up that failed because a port the server binds was taken in the meantime (by a
    server starting beside it, or another program): the config is not at fault, launch again."""
    return any(_PORT_CLASH.search(line) for line in lines)


def _detail(lines: Sequence[str], i: int) -> str:
    """The matching line, plus the indented lines pydantic prints under a ValidationError."""
    text = strip_prefix(lines[i])
    if "ValidationError" in text:
        more = [strip_prefix(x) for x in lines[i + 1 : i + 4] if x.strip()]
        text = " | ".join([text, *more])
    return text[:600]


def classify(lines: Sequence[str], *, after_ready: bool = False) -> tuple[FailureReason, str]:
    """The failure class and its evidence line; ``CRASH`` with the last error-looking line when
    nothing known matches. ``after_ready`` reports an unknown death as ``ENGINE_DEAD``."""
    for reason, pattern in _CLASSES:
        for i, line in enumerate(lines):
            if pattern.search(line):
                return reason, _detail(lines, i)
    fallback = FailureReason.ENGINE_DEAD if after_ready else FailureReason.CRASH
    for line in reversed(lines):
        s = strip_prefix(line)
        if re.search(r"Error|Exception|Killed|Traceback|error", s):
            return fallback, s[:600]
    tail = next((strip_prefix(x) for x in reversed(lines) if x.strip()), "")
    return fallback, (tail or "exited without any log output")[:600]
