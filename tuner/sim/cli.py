"""``python -m tuner.sim serve MODEL_DIR [vLLM flags]``: vLLM 0.24's ``serve`` argument parser.

Modelled: the flags the tuner uses, with vLLM's parsing rules (dashes or underscores,
``BooleanOptionalAction`` pairs, human-readable ints, JSON or dotted ``-cc.key=value`` config
arguments, ``-O3``), argparse's exit 2 on unknown flags, and the config-time refusals of
``create_engine_config`` (exit 1 after a traceback) with vLLM's exact texts. Flags vLLM has but the
simulator ignores (``--seed``, ...) are accepted and have no effect; ``--dtype``,
``--quantization`` and ``--speculative-config`` change its greedy outputs
(:mod:`tuner.sim.answers`); ``--quantization fp8`` also its weights' memory, so its KV cache
(:func:`tuner.memory.weight_bytes`), and its speed (fewer weight bytes a step and faster GEMMs,
:class:`tuner.sim.engine.SpeedModel`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["SimArgs", "build_parser", "human_readable_int", "parse_args"]

KV_CACHE_DTYPES = [
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
]
CUDAGRAPH_MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
DOTTED_BASES = {
    "--compilation-config": "compilation_config",
    "-cc": "compilation_config",
    "--limit-mm-per-prompt": "limit_mm_per_prompt",
}
_HUMAN = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgGtT])$")


def human_readable_int(value: str) -> int:
    """vLLM's parser: ``1k``=1000, ``1K``=1024, ``25.6k``=25600; decimals only with lowercase."""
    value = value.strip()
    m = _HUMAN.match(value)
    if m:
        number, suffix = m.groups()
        power = "kmgt".index(suffix.lower()) + 1
        if suffix.islower():
            return int(float(number) * 1000**power)
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to "
                f"use the decimal suffix {suffix.lower()} instead?"
            )
        return int(number) * 1024**power
    try:
        return int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"Invalid human-readable integer: {value}") from exc


def _max_model_len(value: str) -> int:
    if value.lower() in ("auto", "-1"):
        return -1
    return human_readable_int(value)


def _json_dict(value: str) -> dict[str, Any]:
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"Invalid JSON: {value}") from exc
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"Expected a JSON object: {value}")
    return obj


def _opt_level(value: str) -> int:
    if value not in ("0", "1", "2", "3"):
        raise argparse.ArgumentTypeError(f"invalid choice: '{value}' (choose from 0, 1, 2, 3)")
    return int(value)


def build_parser(*, suppress_defaults: bool = False) -> argparse.ArgumentParser:
    """The ``vllm`` parser with a ``serve`` subcommand; ``suppress_defaults`` omits unset flags."""
    parser = argparse.ArgumentParser(prog="vllm", description="vLLM CLI (simulated)")
    sub = parser.add_subparsers(dest="subparser", required=True)
    p = sub.add_parser("serve", usage="vllm serve [model_tag] [options]")
    p.add_argument("model_tag", help="model directory (config.json + tokenizer.json)")
    bool_flag = argparse.BooleanOptionalAction
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", "-q", default=None)
    p.add_argument("--speculative-config", "-sc", type=_json_dict, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trust-remote-code", action=bool_flag, default=False)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    p.add_argument("--kv-cache-memory-bytes", type=human_readable_int, default=None)
    p.add_argument("--num-gpu-blocks-override", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--max-model-len", type=_max_model_len, default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None)
    p.add_argument("--max-num-partial-prefills", type=int, default=1)
    p.add_argument("--enable-prefix-caching", action=bool_flag, default=None)
    p.add_argument("--enable-chunked-prefill", action=bool_flag, default=None)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    p.add_argument("--enforce-eager", action=bool_flag, default=False)
    p.add_argument("--compilation-config", "-cc", type=_json_dict, default=None)
    p.add_argument("--max-cudagraph-capture-size", type=int, default=None)
    p.add_argument("--cudagraph-capture-sizes", type=int, nargs="+", default=None)
    p.add_argument(
        "--performance-mode",
        choices=["balanced", "interactivity", "throughput"],
        default="balanced",
    )
    p.add_argument("--optimization-level", "-O", type=_opt_level, default=2)
    p.add_argument("--limit-mm-per-prompt", type=_json_dict, default=None)
    p.add_argument("--disable-log-stats", action="store_true", default=False)
    p.add_argument("--enable-log-requests", action=bool_flag, default=False)
    p.add_argument("--async-scheduling", action=bool_flag, default=None)
    # accepted, not modelled (the lever screen's flags: conf/screen/default.yaml)
    p.add_argument("--long-prefill-token-threshold", type=int, default=0)
    p.add_argument("--max-long-partial-prefills", type=int, default=1)
    p.add_argument("--disable-cascade-attn", action=bool_flag, default=False)
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--shutdown-timeout", type=int, default=0)
    if suppress_defaults:
        for action in p._actions:
            if action.dest not in ("help", "model_tag"):
                action.default = argparse.SUPPRESS
    return parser


def _coerce(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _normalise(argv: Sequence[str]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Dashes for underscores in flag names, ``-O3``/``-O=3`` expansion, and dotted keys pulled out.

    Returns the remaining argv and ``{dest: {key: value}}`` from the dotted arguments.
    """
    out: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    i = 0
    args = list(argv)
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-") or arg == "-" or re.match(r"^-\d", arg):
            out.append(arg)
            continue
        m = re.match(r"^-O=?(\d)$", arg)
        if m:
            out += ["--optimization-level", m.group(1)]
            continue
        name, eq, value = arg.partition("=")
        base, dot, key = name.partition(".")
        if base.startswith("--"):
            base = "--" + base[2:].replace("_", "-")
        if dot and base in DOTTED_BASES:
            if not eq:
                if i >= len(args):
                    out.append(arg)
                    continue
                value = args[i]
                i += 1
            target = dotted.setdefault(DOTTED_BASES[base], {})
            parts = key.split(".")
            for part in parts[:-1]:
                target = target.setdefault(part, {})
            leaf = parts[-1]
            if leaf.endswith("+"):
                target.setdefault(leaf[:-1], []).append(_coerce(value))
            else:
                target[leaf] = _coerce(value)
            continue
        out.append(base + ("." + key if dot else "") + (eq + value if eq else ""))
    return out, dotted


@dataclasses.dataclass
class SimArgs:
    """Parsed ``serve`` arguments plus which flags the user gave (for vLLM's defaulting rules)."""

    ns: argparse.Namespace
    user_set: frozenset[str]
    compilation_config: dict[str, Any]
    limit_mm_per_prompt: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ns, name)

    def non_default_args(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model_tag": self.ns.model_tag}
        for key in sorted(self.user_set):
            if key in ("model_tag", "subparser"):
                continue
            out[key] = getattr(self.ns, key, None)
        if self.compilation_config:
            out["compilation_config"] = self.compilation_config
        out["model"] = self.ns.model_tag
        return out


def parse_args(argv: Sequence[str]) -> SimArgs:
    """Parse like ``vllm``; exits 2 (argparse) on unknown flags or bad values."""
    norm, dotted = _normalise(argv)
    ns = build_parser().parse_args(norm)
    given = build_parser(suppress_defaults=True).parse_args(norm)
    user_set = frozenset(k for k in vars(given) if k not in ("model_tag", "subparser"))
    cc = dict(ns.compilation_config or {})
    cc.update(dotted.get("compilation_config", {}))
    mm = dict(ns.limit_mm_per_prompt or {})
    mm.update(dotted.get("limit_mm_per_prompt", {}))
    user_set = user_set | {k for k, v in dotted.items() if v}
    return SimArgs(ns, user_set, cc, mm)
