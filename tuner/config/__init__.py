"""Typed configuration: Hydra structured-config schemas, converted once at the entry point.

The schemas are registered in Hydra's ConfigStore as ``tuner_schema`` (the primary config's first
default), so an unknown key or a wrong type fails when Hydra composes the config.
:func:`tuner.checks.to_config` turns the composed ``DictConfig`` into these dataclasses
(:func:`convert`) and checks what types cannot (ranges, choices): the config's own checks
(:mod:`tuner.config.values`), and each stage's; nothing below the entry point sees a
``DictConfig``. This package imports no stage.

One module per concern, every public name re-exported here (``from tuner.config import X``):

* :mod:`tuner.config.engine` — ``engine`` and ``model``: the server and what it serves;
* :mod:`tuner.config.workload` — ``workload``: the requests, their arrivals, the SLOs;
* :mod:`tuner.config.search` — ``space``, ``study``, ``objective``, ``confirm``, ``plan``;
* :mod:`tuner.config.screen` — ``screen``: the lever screen's candidates and settings;
* :mod:`tuner.config.compose` — :class:`TunerConfig` (with ``tracking`` and ``paths``), its
  registration, composition and conversion, and the refusal of keys the schema does not have;
* :mod:`tuner.config.values` — the checks of values: choices, ranges, counts, the model directory.
"""

from tuner.config.compose import (
    ROOT,
    PathsConfig,
    TrackingConfig,
    TunerConfig,
    available,
    check_model_path,
    check_override_keys,
    compose_config,
    conf_dir,
    convert,
    register_schemas,
    unknown_key,
)
from tuner.config.engine import ContainerConfig, EngineConfig, ModelConfig
from tuner.config.screen import LeverSpec, ScreenConfig, chosen_levers, screen_space
from tuner.config.search import (
    DEFAULT_PICKS,
    QUALITY_MEASURES,
    CapacityConfig,
    ConfirmConfig,
    ObjectiveConfig,
    ObjectiveSpec,
    ParamSpec,
    PlanConfig,
    PrescreenConfig,
    QualityConfig,
    SpaceConfig,
    StudyConfig,
)
from tuner.config.values import (
    ARRIVALS,
    CONFIRM_PICKS,
    DIRECTIONS,
    DISTS,
    ENDPOINTS,
    ENGINE_KINDS,
    PARAM_TYPES,
    SAMPLERS,
    TIMESTAMP_FORMATS,
    TRACE_FORMATS,
    check_confirm,
    check_engine,
    check_images,
    check_model,
    check_plan,
    check_study,
    check_workload,
    one_of,
    usable_cores,
)
from tuner.config.workload import (
    ArrivalConfig,
    DistConfig,
    ImageConfig,
    SLOConfig,
    TraceConfig,
    WorkloadConfig,
)

__all__ = [
    "ARRIVALS",
    "CONFIRM_PICKS",
    "DIRECTIONS",
    "DISTS",
    "ENDPOINTS",
    "ENGINE_KINDS",
    "PARAM_TYPES",
    "QUALITY_MEASURES",
    "ROOT",
    "SAMPLERS",
    "TIMESTAMP_FORMATS",
    "TRACE_FORMATS",
    "ArrivalConfig",
    "CapacityConfig",
    "ConfirmConfig",
    "DEFAULT_PICKS",
    "ContainerConfig",
    "DistConfig",
    "EngineConfig",
    "ImageConfig",
    "LeverSpec",
    "ModelConfig",
    "ObjectiveConfig",
    "ObjectiveSpec",
    "ParamSpec",
    "PathsConfig",
    "PlanConfig",
    "PrescreenConfig",
    "QualityConfig",
    "SLOConfig",
    "ScreenConfig",
    "SpaceConfig",
    "StudyConfig",
    "TraceConfig",
    "TrackingConfig",
    "TunerConfig",
    "WorkloadConfig",
    "available",
    "check_confirm",
    "check_engine",
    "check_images",
    "check_model",
    "check_model_path",
    "check_plan",
    "check_override_keys",
    "check_study",
    "check_workload",
    "chosen_levers",
    "compose_config",
    "conf_dir",
    "convert",
    "one_of",
    "register_schemas",
    "screen_space",
    "unknown_key",
    "usable_cores",
]
