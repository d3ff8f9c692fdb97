"""``screen``: the lever screen (:mod:`tuner.screen`), each candidate flag alone against vLLM's
defaults, and :func:`screen_space`, the search space its trials are asked from."""

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from tuner.config.search import ParamSpec, SpaceConfig

__all__ = ["LeverSpec", "ScreenConfig", "chosen_levers", "screen_space"]


@dataclass
class LeverSpec:
    """One candidate: one ``vllm serve`` flag set to one value, everything else at vLLM's
    defaults; the name is the key in ``screen.levers``."""

    param: str = MISSING
    """The parameter (vLLM's ``dest``: ``kv_cache_dtype``); levers of one flag share it."""
    value: Any = MISSING
    flag: str | None = None
    """The flag (default ``--`` + param with dashes); a dotted one (``-cc.cudagraph_mode``) is
    passed as ``flag=value``."""
    default: Any = None
    """vLLM 0.24's default of the flag (documentation: the defaults arm passes no flag)."""
    changes: str = ""
    """What it changes, in one line."""
    source: str = ""
    """Where vLLM 0.24.0 defines it (a path in github.com/vllm-project/vllm)."""
    sim: str = ""
    """What the simulator models of it ("" : nothing, so the screen on the sim shows no change)."""
    real_weights: bool = False
    """Screened only when the model's weights are real (speculative decoding: its gain is the
    drafts' acceptance, which says nothing on dummy weights); left out otherwise, with a log
    line (:func:`tuner.screen.real_weights_only`)."""
    enabled: bool = True


@dataclass
class ScreenConfig:
    """``mode=screen``: every lever alone against vLLM's defaults, each config's SLO capacity on
    fresh servers (``objective=capacity``, the incumbent probe off), interleaved with the
    defaults."""

    servers: int = 1
    """Fresh servers per lever (the follow-up of a lever that moved: 3)."""
    defaults_every: int = 4
    """The defaults are measured first, after every this many lever servers, and last."""
    only: list[str] = field(default_factory=list)
    """Screen only these levers (names in ``screen.levers``); empty: every enabled one."""
    follow_up: float = 0.05
    """A lever whose point change is at least this (a fraction) is marked for the follow-up."""
    predict_start: bool = True
    """Each server's capacity search, after the workload's own replay, tries first the median
    crossing of its config's earlier servers (walking by narrow steps from there), else the
    defaults' best capacity so far, as a prediction (a loss there narrows the bracket below it,
    a hold climbs from it; nothing is capped): fewer replays than climbing from the workload's
    load. False: every server searches from the workload's load alone."""
    levers: dict[str, LeverSpec] = field(default_factory=dict)


def chosen_levers(screen: ScreenConfig) -> dict[str, LeverSpec]:
    """The levers this screen runs: ``screen.only`` (in its order), else every enabled one."""
    if screen.only:
        return {name: screen.levers[name] for name in screen.only if name in screen.levers}
    return {name: lever for name, lever in screen.levers.items() if lever.enabled}


def screen_space(screen: ScreenConfig) -> SpaceConfig:
    """The screen's space: one categorical param per flag of the chosen levers, its choices
    ``None`` (vLLM's default: the flag is not passed) and the value of every lever of that flag
    in ``screen.levers``, chosen or not, in their order: Optuna keeps a categorical's choices
    for a study's life, so a stored screen continued with other levers (``screen.only``) asks
    from the same choices. Its ``default`` is None, so a lever's trial passes its one flag and
    nothing else."""
    params: dict[str, ParamSpec] = {}
    for lever in chosen_levers(screen).values():
        params.setdefault(
            lever.param,
            ParamSpec(type="categorical", flag=lever.flag, choices=[None], default=None),
        )
    for lever in screen.levers.values():
        spec = params.get(lever.param)
        if spec is not None and spec.choices is not None and lever.value not in spec.choices:
            spec.choices.append(lever.value)
    return SpaceConfig(params=params)
