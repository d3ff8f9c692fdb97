"""The entry point's config: composed (Hydra) → converted to dataclasses → checked, once.

:func:`check` runs every check of a :class:`~tuner.config.TunerConfig` in one fixed order; the first
that fails raises :class:`~tuner.errors.ConfigError` (one line), before anything is launched.
``tuner.config`` checks what its schema alone can judge (choices, ranges, the loopback host, the
model directory); each stage checks what only it knows, in its own ``check(cfg)``:
``engine.argv`` the flags the tuner sets itself (``--host``, ``--port``), ``engine.clock`` the
simulator's speed-up, ``engine.pool`` the cores of ``engine.cpu_pinning``, ``prescreen`` what
the simulator's landscape models, ``score`` the objectives' metrics, ``replay`` the endpoint and
event loop of its client, ``workload.trace`` the trace settings, ``workload.images`` the image
sizes against the model, and ``space`` every searched bound against vLLM's range,
``quality_guard`` the baseline pick it compares with. This module imports the stages, so
``tuner.config`` imports none of them.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

from omegaconf import DictConfig

from tuner import config, model_source, prescreen, quality_guard, replay, score, screen, space
from tuner.config import TunerConfig
from tuner.engine import argv, clock, pool
from tuner.workload import images, trace

log = logging.getLogger(__name__)

__all__ = ["CHECKS", "check", "load_config", "to_config"]

CHECKS: tuple[Callable[[TunerConfig], None], ...] = (
    config.check_engine,
    argv.check,
    clock.check,
    pool.check,
    config.check_study,
    prescreen.check,
    score.check,
    config.check_confirm,
    config.check_plan,
    replay.check,
    config.check_workload,
    trace.check,
    config.check_images,
    config.check_model,
    images.check,
    space.check,
    quality_guard.check,
    screen.check,
)
"""In the order they run (the model directory before what reads it: image sizes, the space)."""


def check(cfg: TunerConfig) -> None:
    """Raise :class:`~tuner.errors.ConfigError` for the first of :data:`CHECKS` that fails."""
    for one in CHECKS:
        one(cfg)


def to_config(cfg: DictConfig) -> TunerConfig:
    """Convert the composed Hydra config to :class:`~tuner.config.TunerConfig`, fill in what the
    model's YAML leaves to be derived (:func:`tuner.model_source.resolve`) and check it.

    Raises :class:`~tuner.errors.ConfigError` with one line naming what is wrong and what is
    allowed.
    """
    model = model_source.resolve(config.convert(cfg).model)
    # the derived values go into the composed config, so that what interpolates them (the
    # space's ${model.max_model_len}) sees them too
    cfg = copy.deepcopy(cfg)
    cfg.model.name = model.name
    cfg.model.max_model_len = model.max_model_len
    cfg.model.local_dir = model.local_dir
    _fit_lengths(cfg, model.max_model_len)
    obj = config.convert(cfg)
    if obj.mode == "screen":  # the screen's trials are asked from its levers' space
        screen.real_weights_only(obj)  # e.g. speculative decoding: real weights only
        obj.space = config.screen_space(obj.screen)
    space.real_weights_only(obj.space, obj.model)  # e.g. speculative decoding: real weights only
    check(obj)
    return obj


def _fit_lengths(cfg: DictConfig, limit: int | None) -> None:
    """A model whose context is shorter than some of the space's ``max_model_len`` choices keeps
    only the choices it can serve, each once, and says so in the log, when the choices include
    the model's own length (the default space's 4096, 8192, 16384 and ``${model.max_model_len}``).
    Other lists are left to the space check, which refuses a choice above the model's length."""
    spec = cfg.space.params.get("max_model_len")
    if (
        limit is None
        or spec is None
        or spec.get("type") != "categorical"
        or not spec.get("choices")
    ):
        return
    if limit not in spec.choices:  # not the default space's pattern: the space check judges it
        return
    choices = [c for c in spec.choices if not isinstance(c, int) or c <= limit]
    kept = list(dict.fromkeys(choices))
    if not choices or kept == list(spec.choices):
        return
    log.info("space.params.max_model_len: choices %s, up to the model's %d", kept, limit)
    spec.choices = kept


def load_config(overrides: list[str]) -> TunerConfig:
    """Compose with Hydra's compose API (tests, notebooks), convert and check, like the CLI does.

    Paths that come from Hydra's run (``paths.output_dir``) must be given in ``overrides``.
    """
    return to_config(config.compose_config(overrides))
