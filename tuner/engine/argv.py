"""Engine command lines and environments, built from data (no per-flag code).

Rules, the same for searched params, the model's fixed flags and the workload's server flags:

* ``True``/``False``  → ``--x`` / ``--no-x`` (vLLM's BooleanOptionalAction pairs);
* a flag with a dot (``-cc.cudagraph_mode``, ``--limit-mm-per-prompt.image``) → ``flag=value``;
* a list → ``--x v1 v2 ...`` (``nargs=+`` flags such as ``--cudagraph-capture-sizes``);
* a mapping → ``--x '{json}'`` (``--compilation-config``, ``--limit-mm-per-prompt``);
* ``None`` → flag omitted (vLLM's default).

An ``--api-key`` (``engine.extra_args``, ``model.fixed_args``) never goes on the command line: the
server gets it as ``VLLM_API_KEY`` (:func:`build_env`; vLLM and the simulator read it), so neither
its own log nor ``/proc/<pid>/cmdline`` shows it, even when the tuner is killed before it masks
anything. ``--host`` and ``--port`` are the tuner's (:func:`check`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.compile_cache import MAX_CAPTURE, cache_location, predicted_key
from tuner.config import EngineConfig, ModelConfig, SpaceConfig, TunerConfig
from tuner.engine.container import check_image
from tuner.errors import ConfigError
from tuner.export import ExportError, parse_serve_args
from tuner.space import flag_name
from tuner.stores import MASK, mask_credentials

__all__ = [
    "fixed_note",
    "fixed_params",
    "MASK",
    "api_key",
    "build_argv",
    "build_env",
    "cache_root",
    "check",
    "check_command",
    "compile_key",
    "params_key",
    "passed",
    "command_missing",
    "command_prefix",
    "flag_args",
    "mask",
    "mask_argv",
    "secret_values",
    "trial_argv",
    "when_holds",
]

API_KEY_FLAG = "--api-key"
_TUNER_FLAGS = ("--host", "--port")
"""Flags the tuner sets on every launch (:func:`build_argv`); refused among the fixed flags."""


def _fmt(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def flag_args(flag: str, value: Any) -> list[str]:
    """argv words for one flag and value (see the module docstring)."""
    if value is None:
        return []
    if isinstance(value, bool):
        if "." in flag:
            return [f"{flag}={str(value).lower()}"]
        return [flag] if value else ["--no-" + flag.lstrip("-")]
    if isinstance(value, Mapping):
        return [flag, json.dumps(dict(value), separators=(",", ":"))]
    if isinstance(value, list | tuple):
        return [flag, *(_fmt(v) for v in value)]
    if "." in flag:
        return [f"{flag}={_fmt(value)}"]
    return [flag, _fmt(value)]


def _dict_args(flags: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in flags.items():
        flag = key if key.startswith("-") else "--" + key.replace("_", "-")
        out += flag_args(flag, value)
    return out


def command_prefix(engine: EngineConfig) -> list[str]:
    """``engine.command`` with a leading ``python`` replaced by this interpreter (not in a
    container: there it runs inside the image)."""
    cmd = list(engine.command)
    if cmd and cmd[0] in ("python", "python3") and engine.container is None:
        cmd[0] = sys.executable
    return cmd


def command_missing(engine: EngineConfig) -> str | None:
    """What is wrong with ``engine.command``'s program on this machine (not on ``PATH``, or not
    an executable file), in one line; None when it can be started."""
    if engine.container is not None:  # engine.command runs inside the image
        program = engine.container.program
        if shutil.which(program) is not None:
            return None
        return f"engine.container.program {program!r} is not found on PATH: install Docker"
    program = command_prefix(engine)[0]
    if shutil.which(program) is not None:
        return None
    where = "is not an executable file" if os.sep in program else "is not found on PATH"
    fix = "install vLLM (pip install -e '.[vllm]')" if engine.kind == "vllm" else "install it"
    return f"engine.command {program!r} {where}: {fix} or set engine.command"


def check_command(engine: EngineConfig) -> None:
    """Raise :class:`ConfigError` when ``engine.command`` cannot be started here, or, in a
    container, the container CLI does not answer or lacks the image (checked before the study is
    opened: every launch would fail)."""
    problem = command_missing(engine)
    if problem:
        raise ConfigError(problem)
    check_image(engine)


def check(cfg: TunerConfig) -> None:
    """The tuner sets ``--host`` (loopback) and ``--port`` itself; one of them in
    ``engine.extra_args``, ``model.fixed_args`` or ``workload.server_args`` would override it
    (vLLM takes the last), so the server would listen elsewhere, or beyond loopback with the dev
    routes of ``VLLM_SERVER_DEV_MODE=1`` open: refused. So is an ``--api-key`` in
    ``workload.server_args`` (give it in ``engine.extra_args`` or ``VLLM_API_KEY``)."""
    sources = {
        "engine.extra_args": list(cfg.engine.extra_args),
        "model.fixed_args": _dict_args(cfg.model.fixed_args),
        "workload.server_args": _dict_args(cfg.workload.server_args),
    }
    dev = cfg.engine.env.get("VLLM_SERVER_DEV_MODE") == "1"
    for where, words in sources.items():
        for word in words:
            flag = word.partition("=")[0]
            if flag in _TUNER_FLAGS:
                why = ": VLLM_SERVER_DEV_MODE=1 opens dev routes" if dev else ""
                raise ConfigError(
                    f"{where} sets {flag}; the tuner sets --host {cfg.engine.host} (loopback "
                    f"only{why}) and a free --port itself: remove it"
                )
            if flag == API_KEY_FLAG and where == "workload.server_args":
                raise ConfigError(
                    "workload.server_args sets --api-key; give the key in engine.extra_args "
                    "or by VLLM_API_KEY (it reaches the server as VLLM_API_KEY, masked)"
                )


def _without_api_key(words: Iterable[str]) -> list[str]:
    """``words`` less ``--api-key KEY`` / ``--api-key=KEY`` (the key travels in the env)."""
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == API_KEY_FLAG:
            skip = True
        elif not word.startswith(API_KEY_FLAG + "="):
            out.append(word)
    return out


def build_argv(
    engine: EngineConfig,
    model: ModelConfig,
    space: SpaceConfig,
    params: Mapping[str, Any],
    *,
    port: int,
    server_args: Mapping[str, Any] | None = None,
    baseline: bool = False,
) -> list[str]:
    """The full server argv for one trial. ``baseline`` passes no searched flag (vLLM defaults)."""
    argv = command_prefix(engine) + [model.path]
    argv += ["--host", engine.host, "--port", str(port), "--served-model-name", model.served_name]
    if model.load_format is not None:
        argv += ["--load-format", model.load_format]
    argv += _without_api_key(_dict_args(model.fixed_args))
    argv += _dict_args(server_args or {})
    if not baseline:
        for name, value in passed(space, params).items():
            spec = space.params.get(name)
            flag = flag_name(name, spec) if spec else "--" + name.replace("_", "-")
            argv += flag_args(flag, value)
    extra = _without_api_key(engine.extra_args)
    argv += extra
    sets_size = any("capture-size" in w or "capture_size" in w for w in argv)
    if engine.pin_capture_size and not sets_size:
        argv.insert(len(argv) - len(extra), f"{PIN_FLAG}={MAX_CAPTURE}")
    return argv


SECRET_NAME = re.compile(r"(?:^|[-_])(?:TOKEN|KEY|SECRET|PASSWORD)$", re.I)
"""A name that holds a secret (an ``engine.env`` variable, a fixed flag): its last word is one of
these (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``--hf-token``, ``--api-key``). Never show its
value. Not ``--max-num-batched-tokens`` or ``--long-prefill-token-threshold``: their values are
numbers the logs need."""

PIN_FLAG = "-cc.max_cudagraph_capture_size"
"""``engine.pin_capture_size``: the capture size fixed at vLLM's cap, so ``max_num_seqs`` does
not change the compile key (not when the argv sets a capture size itself)."""


def fixed_params(model: ModelConfig) -> dict[str, Any]:
    """``model.fixed_args`` as the server reads them, by param name (``kv_cache_dtype``): the
    words :func:`build_argv` passes, parsed back as vLLM's argparse does
    (:func:`tuner.export.parse_serve_args`; ``--no-x`` as ``x: False``). Empty when they cannot
    be parsed (the server judges those)."""
    try:
        _, flags = parse_serve_args(_without_api_key(_dict_args(model.fixed_args)))
    except ExportError:
        return {}
    out: dict[str, Any] = {}
    for key, value in flags.items():
        if key.startswith("no-") and value is True:
            key, value = key[3:], False
        out[key.replace("-", "_")] = value
    return out


def fixed_note(model: ModelConfig) -> str:
    """``model.fixed_args`` for a log line: ``"; every server also runs with quantization=fp8"``
    (the API key and any flag named like a secret left out; empty without fixed args). Tables
    label a trial by its searched params, so "(vLLM defaults)" there means the searched ones;
    this line says what else runs."""
    fixed = {k: v for k, v in fixed_params(model).items() if not SECRET_NAME.search(k)}
    words = " ".join(f"{k}={v}" for k, v in fixed.items())
    return f"; every server also runs with {words}" if words else ""


def passed(space: SpaceConfig, params: Mapping[str, Any]) -> dict[str, Any]:
    """The params that become flags (:func:`build_argv`; the precheck judges the same): each one
    whose spec's ``when`` holds (:func:`when_holds`), and every one without a ``when`` or a spec.
    The others stay at vLLM's default."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        spec = space.params.get(name)
        if spec is not None and spec.when and not when_holds(spec.when, params, space):
            continue
        out[name] = value
    return out


def when_holds(when: Mapping[str, Any], params: Mapping[str, Any], space: SpaceConfig) -> bool:
    """A param's ``when`` condition on the other params (missing ones at vLLM's default)."""
    for other, want in when.items():
        spec = space.params.get(other)
        have = params.get(other, spec.default if spec is not None else None)
        if have != want:
            return False
    return True


def _flag_values(
    engine: EngineConfig, model: ModelConfig | None, named: Callable[[str], bool]
) -> list[str]:
    """The values of the flags in ``engine.extra_args`` and the model's fixed flags whose name
    (``--api-key``, ``--hf-token``) ``named`` accepts."""
    words = list(engine.extra_args) + (_dict_args(model.fixed_args) if model else [])
    out: list[str] = []
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if not flag.startswith("--") or not named(flag):
            continue
        if eq:
            out.append(value)
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            out.append(words[i + 1])
    return out


def _flag_api_key(engine: EngineConfig, model: ModelConfig | None) -> str | None:
    keys = _flag_values(engine, model, lambda flag: flag == API_KEY_FLAG)
    return keys[0] if keys else None


def api_key(
    engine: EngineConfig, model: ModelConfig, environ: Mapping[str, str] | None = None
) -> str | None:
    """The key the server will demand: ``--api-key`` among the fixed flags, else
    ``VLLM_API_KEY`` from the environment (vLLM reads it too); None if neither is set."""
    environ = os.environ if environ is None else environ
    return _flag_api_key(engine, model) or environ.get("VLLM_API_KEY") or None


def secret_values(
    engine: EngineConfig,
    environ: Mapping[str, str] | None = None,
    model: ModelConfig | None = None,
) -> list[str]:
    """Values that must never appear in what the tuner writes (params, tags, logs, artifacts):
    the passed-through variables, secret-named ``engine.env`` entries, and the value of every
    secret-named flag (:data:`SECRET_NAME`: ``--api-key``, ``--hf-token``) in the model's fixed
    flags or ``engine.extra_args``."""
    environ = os.environ if environ is None else environ
    out = [environ[k] for k in engine.pass_env if environ.get(k)]
    out += _flag_values(engine, model, lambda flag: bool(SECRET_NAME.search(flag)))
    for k, v in engine.env.items():
        if v.startswith("$") and environ.get(v[1:]):
            out.append(environ[v[1:]])
        elif SECRET_NAME.search(k) and v:
            out.append(v)
    return sorted({s for s in out if len(s) >= 4}, key=len, reverse=True)


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value replaced by ``***``, and the password of any URL in it
    (``scheme://user:password@host``: ``study.storage``, ``tracking.uri``; by its place, not its
    value, so a short or common password does not mask every word that equals it)."""
    for s in secrets:
        text = text.replace(s, MASK)
    return mask_credentials(text)


def mask_argv(argv: Iterable[str], secrets: Iterable[str]) -> list[str]:
    """argv with secrets masked, also the value after ``--api-key``."""
    secrets = list(secrets)
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if word == API_KEY_FLAG:
            hide_next = True
        elif word.startswith(API_KEY_FLAG + "="):
            word = API_KEY_FLAG + "=" + MASK
        out.append(mask(word, secrets))
    return out


def trial_argv(
    cfg: TunerConfig, params: Mapping[str, Any], *, port: int, baseline: bool
) -> list[str]:
    """:func:`build_argv` for a trial of ``cfg``: its engine, model, space and workload flags."""
    return build_argv(
        cfg.engine,
        cfg.model,
        cfg.space,
        params,
        port=port,
        server_args=cfg.workload.server_args,
        baseline=baseline,
    )


def cache_root(cfg: TunerConfig) -> Path | None:
    """``VLLM_CACHE_ROOT`` for the servers (``engine.cache_root``,
    :func:`tuner.compile_cache.cache_location`): by default, for real vLLM, one per user, so
    torch.compile results are shared by every study on the machine."""
    return cache_location(cfg.engine.cache_root, cfg.engine.kind, cfg.paths.state_dir)


def compile_key(cfg: TunerConfig, argv: Sequence[str]) -> str | None:
    """The predicted compile key of a launch of ``argv``
    (:func:`tuner.compile_cache.predicted_key`): only ever used to order launches."""
    n = len(command_prefix(cfg.engine))
    return predicted_key(argv[n:], cfg.engine.env, prefix=cfg.engine.command)


def build_env(
    engine: EngineConfig,
    *,
    cache_root: Path | None,
    environ: Mapping[str, str] | None = None,
    model: ModelConfig | None = None,
) -> dict[str, str]:
    """The server's environment: ours, minus ``VLLM_PORT``, plus the lease and engine settings.

    Secrets travel here (``HF_TOKEN``, ``VLLM_API_KEY`` from ``engine.pass_env``), never in argv;
    an ``--api-key`` of ``engine.extra_args`` or ``model``'s fixed flags becomes ``VLLM_API_KEY``.
    """
    base = dict(os.environ if environ is None else environ)
    base.pop("VLLM_PORT", None)  # internal port base; must be unset for back-to-back servers
    env = {k: v for k, v in base.items() if k not in engine.pass_env}
    for k in engine.pass_env:
        if base.get(k):
            env[k] = base[k]
    for k, v in engine.env.items():
        env[k] = base.get(v[1:], "") if v.startswith("$") else v
    key = _flag_api_key(engine, model)
    if key:
        env["VLLM_API_KEY"] = key
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in engine.gpus)
    if engine.kind == "sim":  # the simulated server models the GPU the precheck predicts for
        env.setdefault("TUNER_SIM_GPU", engine.gpu)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("NO_COLOR", "1")
    if cache_root is not None:
        env["VLLM_CACHE_ROOT"] = str(cache_root)
    return env


def params_key(cfg: TunerConfig, params: Mapping[str, Any], baseline: bool = False) -> str | None:
    """:func:`compile_key` of a trial of ``params`` (its port plays no part)."""
    return compile_key(cfg, trial_argv(cfg, params, port=0, baseline=baseline))
