"""Engine command lines and environments, built from data (no per-flag code).

Rules, the same for searched params, the model's fixed flags and the workload's server flags:

* ``True``/``False``  → ``--x`` / ``--no-x`` (vLLM's BooleanOptionalAction pairs);
* a flag with a dot (``-cc.cudagraph_mode``, ``--limit-mm-per-prompt.image``) → ``flag=value``;
* a list → ``--x v1 v2 ...`` (``nargs=+`` flags such as ``--cudagraph-capture-sizes``);
* a mapping → ``--x '{json}'`` (``--compilation-config``, ``--limit-mm-per-prompt``);
* ``None`` → flag omitted (vLLM's default).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tuner.config import EngineConfig, ModelConfig, SpaceConfig, TunerConfig
from tuner.errors import ConfigError
from tuner.space import flag_name

__all__ = [
    "MASK",
    "api_key",
    "build_argv",
    "build_env",
    "cache_root",
    "check_command",
    "command_missing",
    "flag_args",
    "mask",
    "secret_values",
    "trial_argv",
    "when_holds",
]

MASK = "***"


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
    """``engine.command`` with a leading ``python`` replaced by this interpreter."""
    cmd = list(engine.command)
    if cmd and cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable
    return cmd


def command_missing(engine: EngineConfig) -> str | None:
    """What is wrong with ``engine.command``'s program on this machine (not on ``PATH``, or not
    an executable file), in one line; None when it can be started."""
    program = command_prefix(engine)[0]
    if shutil.which(program) is not None:
        return None
    where = "is not an executable file" if os.sep in program else "is not found on PATH"
    fix = "install vLLM (pip install -e '.[vllm]')" if engine.kind == "vllm" else "install it"
    return f"engine.command {program!r} {where}: {fix} or set engine.command"


def check_command(engine: EngineConfig) -> None:
    """Raise :class:`ConfigError` when ``engine.command`` cannot be started here (checked before
    the study is opened: every launch would fail)."""
    problem = command_missing(engine)
    if problem:
        raise ConfigError(problem)


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
    argv += _dict_args(model.fixed_args)
    argv += _dict_args(server_args or {})
    if not baseline:
        for name, value in params.items():
            spec = space.params.get(name)
            if spec is not None and spec.when and not when_holds(spec.when, params, space):
                continue
            flag = flag_name(name, spec) if spec else "--" + name.replace("_", "-")
            argv += flag_args(flag, value)
    argv += list(engine.extra_args)
    return argv


def when_holds(when: Mapping[str, Any], params: Mapping[str, Any], space: SpaceConfig) -> bool:
    """A param's ``when`` condition on the other params (missing ones at vLLM's default)."""
    for other, want in when.items():
        spec = space.params.get(other)
        have = params.get(other, spec.default if spec is not None else None)
        if have != want:
            return False
    return True


def _flag_api_key(engine: EngineConfig, model: ModelConfig | None) -> str | None:
    words = list(engine.extra_args) + (_dict_args(model.fixed_args) if model else [])
    for i, word in enumerate(words):
        if word == "--api-key" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--api-key="):
            return word.split("=", 1)[1]
    return None


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
    the passed-through variables, secret-looking ``engine.env`` entries, and any ``--api-key``
    given in the model's fixed flags or ``engine.extra_args``."""
    environ = os.environ if environ is None else environ
    out = [environ[k] for k in engine.pass_env if environ.get(k)]
    flag_key = _flag_api_key(engine, model)
    if flag_key:
        out.append(flag_key)
    for k, v in engine.env.items():
        if v.startswith("$") and environ.get(v[1:]):
            out.append(environ[v[1:]])
        elif re.search(r"TOKEN|KEY|SECRET|PASSWORD", k, re.I) and v:
            out.append(v)
    return sorted({s for s in out if len(s) >= 4}, key=len, reverse=True)


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value replaced by ``***``."""
    for s in secrets:
        text = text.replace(s, MASK)
    return text


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
        if word == "--api-key":
            hide_next = True
        elif word.startswith("--api-key="):
            word = "--api-key=" + MASK
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
    """``VLLM_CACHE_ROOT`` for the servers: ``engine.cache_root``, else (real vLLM) a folder of
    the state dir, so torch.compile results are shared by the trials of every run."""
    if cfg.engine.cache_root:
        return Path(cfg.engine.cache_root)
    if cfg.engine.kind == "vllm":
        return Path(cfg.paths.state_dir) / "vllm_cache"
    return None


def build_env(
    engine: EngineConfig,
    *,
    cache_root: Path | None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The server's environment: ours, minus ``VLLM_PORT``, plus the lease and engine settings.

    Secrets travel here (``HF_TOKEN``, ``VLLM_API_KEY`` from ``engine.pass_env``), never in argv.
    """
    base = dict(os.environ if environ is None else environ)
    base.pop("VLLM_PORT", None)  # internal port base; must be unset for back-to-back servers
    env = {k: v for k, v in base.items() if k not in engine.pass_env}
    for k in engine.pass_env:
        if base.get(k):
            env[k] = base[k]
    for k, v in engine.env.items():
        env[k] = base.get(v[1:], "") if v.startswith("$") else v
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in engine.gpus)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("NO_COLOR", "1")
    if cache_root is not None:
        env["VLLM_CACHE_ROOT"] = str(cache_root)
    return env
