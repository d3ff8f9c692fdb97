"""The whole config, :class:`TunerConfig`, and how it is made: registered with Hydra
(:func:`register_schemas`), composed (:func:`compose_config`), converted to the dataclasses
(:func:`convert`); with the keys the schema does not have refused on the way (:func:`unknown_key`,
:func:`check_override_keys`), and the config groups' options (:func:`conf_dir`, :func:`available`).
"""

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from tuner.config.engine import EngineConfig, ModelConfig
from tuner.config.screen import ScreenConfig
from tuner.config.search import (
    ConfirmConfig,
    ObjectiveConfig,
    PlanConfig,
    SpaceConfig,
    StudyConfig,
)
from tuner.config.workload import WorkloadConfig
from tuner.errors import ConfigError

__all__ = [
    "ROOT",
    "PathsConfig",
    "TrackingConfig",
    "TunerConfig",
    "available",
    "check_model_path",
    "check_override_keys",
    "compose_config",
    "conf_dir",
    "convert",
    "register_schemas",
    "unknown_key",
]

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: ``conf/`` and the ``${tuner_root:}`` resolver's value."""


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str = "sqlite:///mlflow.db"
    experiment: str | None = None
    """Default: the study name."""


@dataclass
class PathsConfig:
    root_dir: str = MISSING
    output_dir: str = MISSING
    """This invocation's run directory (Hydra's); trial artifacts go to ``trial_NNNN/`` below it."""
    state_dir: str = MISSING
    """Survives invocations: Optuna storage, compile cache."""


@dataclass
class TunerConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    space: SpaceConfig = field(default_factory=SpaceConfig)
    study: StudyConfig = field(default_factory=StudyConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    confirm: ConfirmConfig = field(default_factory=ConfirmConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    screen: ScreenConfig = field(default_factory=ScreenConfig)
    """The lever screen's candidates and settings (read when ``mode`` is ``screen``)."""
    mode: str = "search"
    """``search`` (the space searched, then the confirm stage) or ``screen`` (each lever of
    ``screen.levers`` alone against vLLM's defaults: :mod:`tuner.screen`); set by the ``mode``
    config group (``mode=screen``)."""
    workload: WorkloadConfig = MISSING
    dry_run: bool = False
    """Print the plan (study, space, first argv) and exit without launching anything."""


def register_schemas() -> None:
    """Register the schema in Hydra's ConfigStore and the ``${tuner_root:}`` resolver."""
    from hydra.core.config_store import ConfigStore

    if not OmegaConf.has_resolver("tuner_root"):
        root = str(ROOT)
        OmegaConf.register_new_resolver("tuner_root", lambda: root)
    ConfigStore.instance().store(name="tuner_schema", node=TunerConfig)


def compose_config(overrides: list[str]) -> DictConfig:
    """Compose with Hydra's compose API (tests, notebooks), as the CLI composes.

    Paths that come from Hydra's run (``paths.output_dir``) must be given in ``overrides``.
    :func:`tuner.checks.load_config` converts and checks the result.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    register_schemas()
    check_override_keys(overrides)
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return compose(config_name="config", overrides=overrides)
    except HydraException as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise ConfigError(" ".join(lines[:2])) from exc


def convert(cfg: DictConfig) -> TunerConfig:
    """Convert the composed Hydra config to :class:`TunerConfig`, unchecked beyond its types
    (:func:`tuner.checks.to_config` converts and checks).

    Raises :class:`ConfigError` with one line naming what is missing or mistyped.
    """
    if OmegaConf.is_missing(cfg, "workload"):
        raise ConfigError(
            f"no workload selected; add +workload=NAME (one of: {', '.join(available('workload'))})"
        )
    _check_composed_keys(cfg)
    try:
        obj = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as exc:
        key = getattr(exc, "full_key", "?")
        raise ConfigError(f"missing required config value {key}") from exc
    except OmegaConfBaseException as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"invalid config: {first} (key {getattr(exc, 'full_key', '?')})") from exc
    assert isinstance(obj, TunerConfig)
    return obj


# --- keys the schema does not have --------------------------------------------------------------
# Hydra refuses an unknown key of a structured config in a YAML file or an override, but an
# override with ``+`` (``+study.ntrials=5``, which Hydra's own message suggests) adds it, and
# OmegaConf.to_object would set it as a stray attribute nobody reads. Both are refused here with
# the closest known key. Dict-typed fields are free-form (``engine.env``, ``model.fixed_args``,
# ``workload.server_args``, the names under ``space.params``) and so are list entries of ``Any``.


def _optional_of(tp: Any) -> Any:
    """``X | None`` → ``X``; any other type as it is."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return tp


def unknown_key(path: Sequence[str]) -> str | None:
    """The one-line complaint about a key path (``["study", "ntrials"]``) that
    :class:`TunerConfig` has no field for, naming the closest known key; None for a known key, or
    one below a free-form field (a dict's own keys, an ``Any``) or below a scalar (a type error
    that OmegaConf reports)."""
    tp: Any = TunerConfig
    for i, key in enumerate(path):
        tp = _optional_of(tp)
        if dataclasses.is_dataclass(tp):
            hints = typing.get_type_hints(tp)
            names = [f.name for f in dataclasses.fields(tp)]
            if key not in names:
                where = ".".join(path[:i])
                (close,) = difflib.get_close_matches(key, names, n=1, cutoff=0.0) or names[:1]
                return (
                    f"unknown config key {'.'.join(path[: i + 1])}; "
                    f"the closest known key is {f'{where}.{close}' if where else close}"
                )
            tp = hints[key]
        elif typing.get_origin(tp) in (dict, list):
            tp = typing.get_args(tp)[-1]  # this key is a free name or an index: its value next
        else:
            return None
    return None


def check_override_keys(overrides: Sequence[str]) -> None:
    """Raise :class:`ConfigError` for a command-line override (``+study.ntrials=5`` or
    ``study.ntrials=5``) whose key the schema does not have, before Hydra composes (its own
    message for a key without ``+`` is several lines, and with ``+`` it adds the key).
    Hydra's own keys (``hydra.run.dir``), group paths (``hydra/launcher``), packages (``@``)
    and flags (``--cfg``) are Hydra's to judge."""
    for arg in overrides:
        if arg.startswith("-") and not arg.startswith("~"):
            continue
        key, sep, _ = arg.partition("=")
        key = key.lstrip("+~")
        if not key or not (sep or arg.startswith("~")) or "@" in key or "/" in key:
            continue
        path = key.split(".")
        if path[0] == "hydra":
            continue
        problem = unknown_key(path)
        if problem:
            raise ConfigError(problem)
    check_model_path(overrides)


def _model_choice(overrides: Sequence[str]) -> str | None:
    """The ``model`` option the overrides select (the last ``model=NAME``), else the default of
    ``conf/config.yaml``."""
    choice = None
    for arg in overrides:
        key, sep, value = arg.lstrip("+~").partition("=")
        if key == "model" and sep:
            choice = value
    if choice is None:
        primary = OmegaConf.load(conf_dir() / "config.yaml")
        for entry in primary.defaults if isinstance(primary, DictConfig) else []:
            if isinstance(entry, DictConfig) and "model" in entry:
                choice = str(entry["model"])
    return choice


def check_model_path(overrides: Sequence[str]) -> None:
    """Refuse ``model.path=...`` on a model option that asks for dummy weights (the shipped
    shapes): its name, ``max_model_len`` and load format belong to its own directory, and a
    run on another model with them would silently serve random weights. ``model=custom`` derives
    them from the path."""
    if not any(a.lstrip("+").startswith("model.path=") for a in overrides):
        return
    choice = _model_choice(overrides)
    option = conf_dir() / "model" / f"{choice}.yaml"
    if choice is None or not option.is_file():
        return
    shipped = OmegaConf.load(option)
    load_format = shipped.get("load_format") if isinstance(shipped, DictConfig) else None
    if load_format is None:
        return
    raise ConfigError(
        f"model.path is set on model={choice}, a shipped shape whose name, max_model_len and "
        f"load_format {load_format} belong to its own directory; for your model use "
        "model=custom model.path=PATH (add model.load_format=dummy for random weights)"
    )


def _key_paths(node: Any, prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """Every key path of a plain container (``OmegaConf.to_container``'s output)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*prefix, str(k))
            yield from _key_paths(v, (*prefix, str(k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _key_paths(v, (*prefix, str(i)))


def _check_composed_keys(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` for the first key of the composed config that the schema does
    not have (one a ``+`` override added)."""
    tree = OmegaConf.to_container(cfg, resolve=False)
    for path in _key_paths(tree, ()):
        problem = unknown_key(path)
        if problem:
            raise ConfigError(problem)


def conf_dir() -> Path:
    return ROOT / "conf"


def available(group: str) -> list[str]:
    """Option names of a config group (the YAML files in ``conf/<group>/``)."""
    d = conf_dir() / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []
