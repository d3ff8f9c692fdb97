"""Stage 1 — the search space: YAML parameter specs → Optuna distributions, checked against vLLM.

Any ``vllm serve`` flag can be searched by naming it in ``conf/space/*.yaml``; the allowed range
of the common ones (:data:`tuner.vllm_rules.RANGES`, vLLM 0.24.0's pydantic config fields) and
choices of a few (below) are checked here, so that a bound vLLM would reject fails at start-up
with one clear line instead of in every trial.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import optuna.distributions as od

from tuner.config import PARAM_TYPES, ModelConfig, ParamSpec, SpaceConfig, TunerConfig
from tuner.errors import ConfigError
from tuner.vllm_rules import NUMERICS, RANGES, numerics_changes

log = logging.getLogger(__name__)

__all__ = [
    "CUDAGRAPH_MODES",
    "KV_CACHE_DTYPES",
    "changed_params",
    "check",
    "defaults",
    "defaults_outside",
    "disable_real_weights",
    "grid",
    "distributions",
    "flag_name",
    "numerics_flags",
    "numerics_params",
    "override_value",
    "real_weights_only",
    "validate_space",
]

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
KV_CACHE_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
    "int8_per_token_head", "fp8_per_token_head", "nvfp4",
)  # fmt: skip

_CHOICES: dict[str, tuple[Any, ...]] = {
    "kv_cache_dtype": KV_CACHE_DTYPES,
    "cudagraph_mode": CUDAGRAPH_MODES,
    "performance_mode": ("balanced", "interactivity", "throughput"),
    "scheduling_policy": ("fcfs", "priority"),
    "optimization_level": (0, 1, 2, 3),
}


def flag_name(name: str, spec: ParamSpec) -> str:
    """The ``vllm serve`` flag for a parameter: ``spec.flag`` or ``--`` + name with dashes."""
    return spec.flag or "--" + name.replace("_", "-")


def _check_value(name: str, value: Any, model: ModelConfig) -> str | None:
    """Why vLLM would reject ``value`` for ``name``, or None if it is allowed."""
    rng = RANGES.get(name)
    if rng is not None and value is not None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"allowed: {rng.allowed}"
        limit = model.max_model_len
        if name == "max_model_len" and limit is not None and value > limit:
            return f"allowed: <= {model.max_model_len} (model {model.name}'s max_model_len)"
        if rng.broken(value) is not None:
            return f"allowed: {rng.allowed}"
    if name in _CHOICES and value is not None:
        allowed = _CHOICES[name]
        v = value.upper() if name == "cudagraph_mode" and isinstance(value, str) else value
        if v not in allowed:
            return f"allowed: {', '.join(map(str, allowed))}"
    return None


def check(cfg: TunerConfig) -> None:
    """``space``: :func:`validate_space` against ``model``."""
    validate_space(cfg.space, cfg.model)


def validate_space(space: SpaceConfig, model: ModelConfig) -> None:
    """Raise :class:`ConfigError` (one line) for a spec Optuna or vLLM would reject."""
    for name, spec in space.params.items():
        where = f"space.params.{name}"
        if spec.type not in PARAM_TYPES:
            raise ConfigError(f"{where}.type is {spec.type!r}; allowed: {', '.join(PARAM_TYPES)}")
        if spec.type in ("float", "int"):
            if spec.low is None or spec.high is None:
                raise ConfigError(f"{where} needs low and high for type {spec.type}")
            if spec.low > spec.high:
                raise ConfigError(f"{where} has low {spec.low} > high {spec.high}")
            if spec.type == "int" and (spec.low != int(spec.low) or spec.high != int(spec.high)):
                raise ConfigError(f"{where} is an int parameter; low and high must be integers")
            for bound, v in (("low", spec.low), ("high", spec.high)):
                why = _check_value(name, int(v) if spec.type == "int" else v, model)
                if why:
                    raise ConfigError(f"{where}.{bound} = {v} is outside vLLM's range; {why}")
            if spec.log and spec.low <= 0:
                raise ConfigError(f"{where} is log-scaled, so low must be > 0 (got {spec.low})")
        elif spec.type == "categorical":
            if not spec.choices:
                raise ConfigError(f"{where} is categorical but has no choices")
            for c in spec.choices:
                why = _check_value(name, c, model)
                if why:
                    raise ConfigError(f"{where} choice {c!r} is outside vLLM's range; {why}")


def _contains(spec: ParamSpec, value: Any) -> bool:
    if spec.type == "bool":
        return isinstance(value, bool)
    if spec.type == "categorical":
        return value in (spec.choices or [])
    assert spec.low is not None and spec.high is not None
    return isinstance(value, int | float) and spec.low <= value <= spec.high


def override_value(value: Any) -> str:
    """A param's value as a Hydra override writes it (``null``, ``true``, ``fp8``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def distributions(space: SpaceConfig) -> dict[str, od.BaseDistribution]:
    """Optuna distributions for the enabled parameters, in YAML order."""
    out: dict[str, od.BaseDistribution] = {}
    for name, spec in space.params.items():
        if not spec.enabled:
            continue
        if spec.type == "float":
            assert spec.low is not None and spec.high is not None
            out[name] = od.FloatDistribution(spec.low, spec.high, log=spec.log, step=spec.step)
        elif spec.type == "int":
            assert spec.low is not None and spec.high is not None
            out[name] = od.IntDistribution(
                int(spec.low), int(spec.high), log=spec.log, step=int(spec.step or 1)
            )
        elif spec.type == "bool":
            out[name] = od.CategoricalDistribution([False, True])
        else:
            out[name] = od.CategoricalDistribution(list(spec.choices or []))
    return out


def grid(space: SpaceConfig) -> dict[str, list[Any]]:
    """The values the grid sampler enumerates per enabled parameter (raises ConfigError)."""
    out: dict[str, list[Any]] = {}
    for name, spec in space.params.items():
        if not spec.enabled:
            continue
        if spec.grid:
            out[name] = list(spec.grid)
        elif spec.type == "bool":
            out[name] = [False, True]
        elif spec.type == "categorical":
            out[name] = list(spec.choices or [])
        elif spec.type == "int" and spec.low is not None and spec.high is not None:
            values = list(range(int(spec.low), int(spec.high) + 1, int(spec.step or 1)))
            if len(values) > 64:
                raise ConfigError(
                    f"space.params.{name} has {len(values)} integer values; give "
                    f"space.params.{name}.grid for the grid sampler"
                )
            out[name] = values
        else:
            raise ConfigError(
                f"space.params.{name} is a float range; give space.params.{name}.grid "
                "(a list of values) for the grid sampler"
            )
    return out


def defaults(space: SpaceConfig) -> dict[str, Any]:
    """vLLM's default for every enabled parameter (the baseline trial's params)."""
    return {n: s.default for n, s in space.params.items() if s.enabled}


def defaults_outside(space: SpaceConfig) -> list[str]:
    """Enabled params whose vLLM default lies outside the searched range (no baseline then); a
    null default is inside only as a categorical's null choice."""
    return [
        n
        for n, s in space.params.items()
        if s.enabled and (s.default is None and not _none_choice(s) or not _contains(s, s.default))
    ]


def _none_choice(spec: ParamSpec) -> bool:
    """A categorical whose choices include null: the flag left out (vLLM's default), as
    ``speculative_config`` in ``conf/space/ngram.yaml``."""
    return spec.type == "categorical" and None in (spec.choices or [])


def resolved(space: SpaceConfig, params: Mapping[str, Any]) -> dict[str, Any]:
    """Params with vLLM's defaults filled in for disabled/unsampled parameters."""
    out = {n: s.default for n, s in space.params.items()}
    out.update(params)
    return out


def changed_params(params: Mapping[str, Any], space: SpaceConfig) -> str:
    """Params that differ from vLLM's defaults, as ``name=value`` (the rest are defaults)."""
    parts = []
    for k, v in params.items():
        spec = space.params.get(k)
        if spec is not None and v != spec.default:
            parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts) or "(vLLM defaults)"


def _dest(name: str, spec: ParamSpec) -> str:
    return flag_name(name, spec).lstrip("-").replace("-", "_")


def numerics_flags(space: SpaceConfig) -> list[str]:
    """The enabled params that can change the model's numerics (:data:`vllm_rules.NUMERICS`):
    a choice, or the range, reaches a value other than vLLM's default behaviour."""
    out = []
    for name, spec in space.params.items():
        neutral = NUMERICS.get(_dest(name, spec))
        if not spec.enabled or neutral is None:
            continue
        choices = spec.choices if spec.type == "categorical" else None  # a range: assume so
        if choices is None or any(v not in neutral for v in choices):
            out.append(name)
    return out


def numerics_params(space: SpaceConfig, params: Mapping[str, Any]) -> dict[str, Any]:
    """The params of ``params`` that change the model's numerics (``name`` → value): set to a
    value other than vLLM's default behaviour for a flag of :data:`vllm_rules.NUMERICS`."""
    by_dest = {_dest(n, s): n for n, s in space.params.items() if n in params}
    changed = numerics_changes({d: params[n] for d, n in by_dest.items()})
    return {by_dest[d]: v for d, v in changed.items()}


def real_weights_only(space: SpaceConfig, model: ModelConfig) -> list[str]:
    """On dummy weights, disable the params marked ``real_weights`` (they stay at vLLM's
    default) and log why; the names disabled."""
    return disable_real_weights(space.params, "space.params %s not searched", model)


def disable_real_weights(items: Mapping[str, Any], what: str, model: ModelConfig) -> list[str]:
    """On dummy weights, disable the enabled entries of ``items`` marked ``real_weights`` (search
    params, screen levers: each has ``enabled`` and ``real_weights``) and log ``what`` (with a
    ``%s`` for their names) and why; the names disabled."""
    if not model.dummy_weights:
        return []
    names = [n for n, s in items.items() if s.enabled and s.real_weights]
    for name in names:
        items[name].enabled = False
    if names:
        log.info(
            what + ": model %s has dummy weights (load_format dummy), and they need real ones",
            ", ".join(names),
            model.name,
        )
    return names
