"""Deployable configs: a trial's server command line as a YAML file for ``vllm serve --config``
and the equivalent one-line command.

vLLM 0.24 reads the YAML with ``FlexibleArgumentParser.load_config_file``
(``vllm/utils/argparse_utils.py``): each key becomes ``--key``; ``true`` adds the bare flag and
**``false`` is dropped silently** (so a flag switched off is written as ``no-<flag>: true``, vLLM's
BooleanOptionalAction negation); a list becomes ``--key v1 v2 ...``; a mapping becomes
``--key '<json>'``; anything else ``--key str(value)``. A ``model:`` key is used when no model is
given on the command line. Dotted flags (``-cc.cudagraph_mode=PIECEWISE``) are merged into their
JSON option (``compilation-config: {cudagraph_mode: PIECEWISE}``).

The YAML is built from the argv the tuner actually launched (masked as recorded), so it says what
was measured. Flags that only made sense for the tuner's own server (host, port, served name, API
key) are dropped; ``confirm.export_drop`` lists them.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import TunerError

__all__ = [
    "recommended_file",
    "SHORT_FLAGS",
    "ExportError",
    "config_argv",
    "parse_serve_args",
    "serve_command",
    "to_yaml",
    "write_export",
]

SHORT_FLAGS = {
    # vLLM 0.24's short aliases (tests/data/vllm-0.24.0-serve-flags.json lists every option)
    "-tp": "tensor-parallel-size",
    "-pp": "pipeline-parallel-size",
    "-dp": "data-parallel-size",
    "-cc": "compilation-config",
    "-q": "quantization",
    "-O": "optimization-level",
}


class ExportError(TunerError):
    """A recorded command line that cannot be turned into a ``--config`` file."""


def _is_value(word: str) -> bool:
    """A word after a flag that is its value (negative numbers included), not the next flag."""
    if not word.startswith("-"):
        return True
    try:
        float(word)
    except ValueError:
        return False
    return True


def _key(flag: str) -> str:
    if flag in SHORT_FLAGS:
        return SHORT_FLAGS[flag]
    if flag.startswith("-O") and flag[2:].isdigit():
        return "optimization-level"
    if not flag.startswith("--"):
        raise ExportError(f"unknown short flag {flag!r}; known: {', '.join(SHORT_FLAGS)}")
    return flag[2:].replace("_", "-")


def _scalar(word: str) -> Any:
    """An int or float that survives ``str()`` unchanged stays a number; all else a string (so a
    value such as ``false`` is never turned into a YAML boolean that vLLM would drop)."""
    try:
        value = json.loads(word)
    except ValueError:
        return word
    if isinstance(value, int | float) and not isinstance(value, bool) and str(value) == word:
        return value
    if isinstance(value, dict):
        return value
    return word


def _nested(value: str) -> Any:
    """A dotted flag's value, as vLLM parses it into the JSON option (``true`` → true)."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def parse_serve_args(words: Sequence[str]) -> tuple[str | None, dict[str, Any]]:
    """``MODEL --flag value ...`` (what follows ``vllm serve``) → (model, {key: value}).

    Values: ``True`` for a bare flag, a list for several values (``nargs=+``), a dict for a JSON
    option and its dotted keys; repeated scalar flags keep the last value, as argparse does.
    """
    model: str | None = None
    i = 0
    if words and _is_value(words[0]):
        model, i = words[0], 1
    out: dict[str, Any] = {}
    while i < len(words):
        word = words[i]
        if _is_value(word):
            raise ExportError(f"unexpected argument {word!r} in the recorded command line")
        flag, eq, inline = word.partition("=")
        values: list[str] = []
        i += 1
        if not eq:
            while i < len(words) and _is_value(words[i]):
                values.append(words[i])
                i += 1
        base, dot, sub = flag.partition(".")
        key = _key(base)
        if dot:
            if not eq:
                if len(values) != 1:
                    raise ExportError(f"{word} needs one value (got {values})")
                inline = values[0]
            target = out.setdefault(key, {})
            if not isinstance(target, dict):
                raise ExportError(f"{word}: --{key} was given a non-JSON value before")
            parts = sub.split(".")
            for p in parts[:-1]:
                target = target.setdefault(p, {})
            target[parts[-1]] = _nested(inline)
        elif eq:
            out[key] = _scalar(inline)
        elif not values:
            out[key] = True
        elif len(values) == 1:
            value = _scalar(values[0])
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                value = {**value, **out[key]}  # dotted keys given earlier win, as in vLLM
            out[key] = value
        else:
            out[key] = [_scalar(v) for v in values]
    return model, out


def config_argv(config: Mapping[str, Any]) -> list[str]:
    """The argv vLLM 0.24's ``load_config_file`` makes of a ``--config`` mapping (same rules)."""
    args: list[str] = []
    for key, value in config.items():
        if isinstance(value, bool):
            if value:
                args.append("--" + key)
        elif isinstance(value, list):
            if value:
                args += ["--" + key, *(str(v) for v in value)]
        elif isinstance(value, dict):
            args += ["--" + key, json.dumps(value)]
        else:
            args += ["--" + key, str(value)]
    return args


def _drop(args: dict[str, Any], drop: Iterable[str]) -> dict[str, Any]:
    gone = {d.lstrip("-").replace("_", "-") for d in drop}
    return {k: v for k, v in args.items() if k not in gone and f"no-{k}" not in gone}


def to_yaml(
    serve_args: Sequence[str], drop: Iterable[str] = (), header: Sequence[str] = ()
) -> tuple[dict[str, Any], str]:
    """(mapping, YAML text) for ``vllm serve --config``; the model goes in as ``model:``."""
    model, args = parse_serve_args(serve_args)
    config: dict[str, Any] = {}
    if model is not None:
        config["model"] = model
    config.update(_drop(args, drop))
    text = "".join(f"# {line}\n" for line in header)
    text += yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    return config, text


def serve_command(config: Mapping[str, Any], program: Sequence[str] = ("vllm", "serve")) -> str:
    """The one-line ``vllm serve MODEL --flag ...`` equivalent to the ``--config`` file."""
    rest = {k: v for k, v in config.items() if k != "model"}
    model = [str(config["model"])] if "model" in config else []
    return shlex.join([*program, *model, *config_argv(rest)])


def recommended_file(picks: Sequence[str], order: Sequence[str]) -> str:
    """The ``best-<pick>.yaml`` that names a recommended trial chosen by ``picks``: the
    baseline's own when vLLM's defaults won (they are what to deploy, whatever other pick also
    chose them), else the first of ``picks`` in ``order`` (``confirm.picks``).

    >>> recommended_file(("goodput", "latency", "knee", "baseline"), ("latency", "goodput"))
    'best-baseline.yaml'
    >>> recommended_file(("knee", "latency"), ("goodput", "latency", "knee"))
    'best-latency.yaml'
    """
    if "baseline" in picks:
        return "best-baseline.yaml"
    name = next((p for p in order if p in picks), next(iter(picks)))
    return f"best-{name}.yaml"


def write_export(
    directory: Path,
    name: str,
    serve_args: Sequence[str],
    *,
    drop: Iterable[str] = (),
    header: Sequence[str] = (),
) -> tuple[Path, Path]:
    """``best-<name>.yaml`` and ``best-<name>.sh`` (the one-line command) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    config, text = to_yaml(serve_args, drop, header)
    yml = directory / f"best-{name}.yaml"
    yml.write_text(text)
    sh = directory / f"best-{name}.sh"
    sh.write_text(
        "#!/bin/sh\n"
        + "".join(f"# {line}\n" for line in header)
        + f"# the same flags as {yml.name}\n"
        + "exec "
        + serve_command(config)
        + ' "$@"\n'
    )
    sh.chmod(0o755)
    return yml, sh
