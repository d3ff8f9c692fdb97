"""The servers' shared compile cache (``VLLM_CACHE_ROOT``): where it is, and which launches
would find their torch.compile result there (warm), to launch those first where order is free.

vLLM keys its cache by its own hash of the config (``torch_compile_cache/<hash>/``; see
docs/design.md, "Start-up and the compile cache"), so one folder serves every vLLM version, model
and GPU: nothing cached can make a launch run another config than asked. The tuner only
*predicts* a launch's key from its argv (:func:`predicted_key`, the factors vLLM hashes) and keeps
an index, predicted key → the hashes vLLM logged (:func:`record`), in the cache root. A wrong
prediction costs only order (a cold launch first), never a different measurement.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import platformdirs

from tuner.records import StartupFacts

__all__ = [
    "INDEX",
    "cache_location",
    "is_warm",
    "predicted_key",
    "record",
    "user_root",
    "warm_first",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
INDEX = "tuner-compile-index.json"

# Flags vLLM 0.24 leaves out of its compile hash (docs/design.md cites where): the API server's,
# CacheConfig's ignored fields, every SchedulerConfig field but max_num_batched_tokens, and
# ModelConfig's ignored fields. ``max_num_seqs`` enters only through the capture size.
_NOT_IN_KEY = frozenset(
    {
        "host",
        "port",
        "served-model-name",
        "api-key",
        "seed",
        "tokenizer",
        "gpu-memory-utilization",
        "enable-prefix-caching",
        "num-gpu-blocks-override",
        "enable-chunked-prefill",
        "max-num-seqs",
        "max-num-partial-prefills",
        "max-long-partial-prefills",
        "long-prefill-token-threshold",
        "scheduling-policy",
        "async-scheduling",
    }
)
_CAPTURE_FLAGS = (
    "max-cudagraph-capture-size",
    "cudagraph-capture-sizes",
    "cc.max_cudagraph_capture_size",
    "cc.cudagraph_capture_sizes",
)
MAX_CAPTURE = 512  # vLLM 0.24's cap on the derived capture size (config/vllm.py)


def user_root() -> Path:
    """The per-user default: ``<user cache dir>/tuner/vllm`` (``$XDG_CACHE_HOME`` on Linux)."""
    return Path(platformdirs.user_cache_dir("tuner")) / "vllm"


def cache_location(setting: str | None, kind: str, state_dir: str | Path) -> Path | None:
    """``VLLM_CACHE_ROOT`` for ``engine.cache_root``: unset → the per-user root for real vLLM
    (the simulator: none); ``user`` → the per-user root; ``state`` → ``<state_dir>/vllm_cache``
    (one per working directory, as before); ``none`` → not set (vLLM's own default); else the
    path given."""
    if setting is None or setting == "":
        return user_root() if kind == "vllm" else None
    if setting == "user":
        return user_root()
    if setting == "state":
        return Path(state_dir) / "vllm_cache"
    if setting == "none":
        return None
    return Path(setting).expanduser()


def _flags(words: Sequence[str]) -> dict[str, Any]:
    """``--x v`` / ``--x=v`` / ``-cc.x=v`` / ``--x`` / ``--no-x`` as {name: value}."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-"):
            continue
        name = word.lstrip("-")
        if "=" in name:
            name, value = name.split("=", 1)
            out[name] = value
            continue
        values = []
        while i < len(words) and not words[i].startswith("-"):
            values.append(words[i])
            i += 1
        if values:
            out[name] = values[0] if len(values) == 1 else values
        elif name.startswith("no-"):
            out[name[3:]] = False
        else:
            out[name] = True
    return out


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


_ENV_NOT_IN_KEY = ("VLLM_CACHE_ROOT", "VLLM_PORT", "VLLM_WORKER_MULTIPROC_METHOD")
"""Variables vLLM 0.24.0 leaves out of its compile factors (``vllm/envs.py``,
``compile_factors``'s ``ignored_factors``): a launch that differs only in them shares the key."""


def predicted_key(
    words: Sequence[str], env: Mapping[str, str] | None = None, *, prefix: Sequence[str] = ()
) -> str | None:
    """The tuner's guess of a launch's compile key: a hash of what vLLM 0.24 hashes, read from
    the server argv (``words``: the model path, then the flags; ``prefix``, the engine command,
    enters too) and the ``VLLM_*`` variables of ``env``. None when the launch compiles nothing
    (``--enforce-eager``, ``-cc.mode=0``)."""
    if not words:
        return None
    flags = _flags(words[1:])
    cc = flags.get("compilation-config")
    cc_json: dict[str, Any] = {}
    if isinstance(cc, str):
        with contextlib.suppress(ValueError):
            cc_json = dict(json.loads(cc))
    mode = flags.get("cc.mode", cc_json.get("mode"))
    if flags.get("enforce-eager") is True or (
        mode is not None and str(mode).upper() in ("0", "NONE")
    ):
        return None
    key = {k: v for k, v in flags.items() if k not in _NOT_IN_KEY}
    explicit = any(f in flags for f in _CAPTURE_FLAGS) or any(
        k in cc_json for k in ("max_cudagraph_capture_size", "cudagraph_capture_sizes")
    )
    if not explicit:  # vLLM's derived size: min(2 x max_num_seqs, 512, max_num_batched_tokens);
        # vLLM's default max_num_seqs (256 or 1024, at most max_num_batched_tokens) gives 512 too
        mns = _int(flags.get("max-num-seqs")) or MAX_CAPTURE // 2
        size = min(2 * mns, MAX_CAPTURE)
        mbt = _int(flags.get("max-num-batched-tokens"))
        key["derived_capture_size"] = min(size, mbt) if mbt else size
    envs = sorted((k, v) for k, v in (env or {}).items() if k.startswith("VLLM_"))
    envs = [(k, v) for k, v in envs if k not in _ENV_NOT_IN_KEY]
    factors = [list(prefix), words[0], sorted(key.items(), key=lambda kv: kv[0]), envs]
    return hashlib.sha256(json.dumps(factors, default=str).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """The index's lock (``flock``): concurrent studies on one machine update it in turn."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / (INDEX + ".lock")).open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((root / INDEX).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record(root: Path | None, key: str | None, facts: StartupFacts | None) -> None:
    """After a launch: index ``key`` → the hashes vLLM logged (atomically, under a lock)."""
    if root is None or key is None or facts is None:
        return
    if not (facts.compile_hash or facts.aot_hash):
        return
    try:
        with _locked(root):
            data = _read(root)
            entry = data.get(key, {})
            entry.update(
                {k: v for k, v in (("vllm", facts.compile_hash), ("aot", facts.aot_hash)) if v}
            )
            entry["seen"] = round(time.time())
            data[key] = entry
            fd, tmp = tempfile.mkstemp(dir=root, prefix=INDEX, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, root / INDEX)
    except OSError as exc:  # the index only orders work: never fail a trial over it
        log.warning("compile cache index %s not updated: %s", root / INDEX, exc)


def is_warm(root: Path | None, key: str | None, index: Mapping[str, Any] | None = None) -> bool:
    """Whether a launch with ``key`` should find its compiled artifact under ``root``: the
    index knows the key and vLLM's folder for it still exists. A launch without a key (compiles
    nothing) counts as warm."""
    if root is None:
        return False
    if key is None:
        return True
    entry = (index if index is not None else _read(root)).get(key)
    if not isinstance(entry, dict):
        return False
    tcc = root / "torch_compile_cache"
    return bool(
        (entry.get("vllm") and (tcc / str(entry["vllm"])).is_dir())
        or (entry.get("aot") and (tcc / "torch_aot_compile" / str(entry["aot"])).is_dir())
    )


def warm_first(items: Sequence[T], key_of: Callable[[T], str | None], root: Path | None) -> list[T]:
    """``items`` with the warm ones first, each group in its own order (a stable sort); as given
    without a cache root."""
    if root is None or len(items) < 2:
        return list(items)
    index = _read(root)
    warm = [is_warm(root, key_of(x), index) for x in items]
    return [x for x, w in zip(items, warm, strict=True) if w] + [
        x for x, w in zip(items, warm, strict=True) if not w
    ]
