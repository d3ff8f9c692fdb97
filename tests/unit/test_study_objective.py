"""A study records its objective; another objective is refused in one line (no mixed objectives),
and the default study name carries a non-default objective."""

from __future__ import annotations

from collections.abc import Callable

import optuna
import pytest

from tuner import study as study_mod
from tuner.config import TunerConfig
from tuner.errors import ConfigError
from tuner.storage import objective_label, open_study, storage_url, study_name
from tuner.stored_study import objective_names

CAPACITY = ["objective=capacity", "workload.slo.ttft_ms=500"]


def test_the_default_study_name_carries_the_objective_but_throughputs(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    # capacity, the default, is named as when it was not: its stored studies continue
    assert study_name(make_cfg("+workload=chat")) == "chat-qwen3-8b-sim-capacity"
    assert study_name(make_cfg("+workload=chat", *CAPACITY)) == "chat-qwen3-8b-sim-capacity"
    # throughput against TTFT, the first default, keeps the bare name its studies have
    assert study_name(make_cfg("+workload=chat", "objective=throughput")) == "chat-qwen3-8b-sim"
    assert objective_label(make_cfg("+workload=chat", "objective=goodput").objective) == "goodput"
    latency = make_cfg("+workload=chat", "objective=latency").objective
    assert objective_label(latency) == "e2e_p95_ms"
    assert study_name(make_cfg("+workload=chat", *CAPACITY, "study.name=mine")) == "mine"


def test_the_default_objective_is_capacity(make_cfg: Callable[..., TunerConfig]) -> None:
    cfg = make_cfg("+workload=chat")
    assert [(o.metric, o.direction) for o in cfg.objective.objectives] == [
        ("capacity_rps", "maximize"),
        ("ttft_p95_ms", "minimize"),
    ]
    assert cfg.objective == TunerConfig().objective  # the schema's default says the same
    assert cfg.confirm.picks[0] == "capacity"
    # its capacity steps are long already: the stressed replay is not made longer too
    assert cfg.confirm.duration_factor == 1.0
    assert make_cfg("+workload=chat", "objective=throughput").confirm.duration_factor == 2.0
    again = make_cfg("+workload=chat", "confirm.duration_factor=2")  # the command line wins
    assert again.confirm.duration_factor == 2.0
    gpus = make_cfg("+workload=chat", "objective=capacity_per_gpu")
    assert gpus.confirm.duration_factor == 1.0 and gpus.objective.objectives[0].metric == (
        "capacity_per_gpu_rps"
    )


def test_a_throughput_study_continued_with_capacity_is_refused_in_one_line(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    first = make_cfg("+workload=chat", "objective=throughput", "study.name=s", "tracking=none")
    stored = open_study(first)
    assert objective_names(stored) == ["output_throughput:maximize", "ttft_p95_ms:minimize"]
    again = make_cfg("+workload=chat", "study.name=s", "tracking=none", *CAPACITY)
    with pytest.raises(ConfigError) as e:
        study_mod.run(again)
    msg = str(e.value)
    assert "\n" not in msg
    assert "'s'" in msg and "output_throughput:maximize" in msg and "capacity_rps:maximize" in msg
    assert "study.name=chat-qwen3-8b-sim-capacity" in msg  # the default name for capacity
    assert msg.endswith("or objective=throughput to continue or report it")  # the stored one
    assert open_study(first).study_name == "s"  # the same objective continues


def test_a_study_stored_before_the_objective_was_kept_continues(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    stored = open_study(
        make_cfg("+workload=chat", "objective=throughput", "study.name=old", "tracking=none")
    )
    del stored  # an older tuner stored no objective attribute: drop it
    cfg = make_cfg("+workload=chat", "study.name=old", "tracking=none", *CAPACITY)
    s = optuna.load_study(study_name="old", storage=storage_url(cfg))
    s._storage.set_study_user_attr(s._study_id, "objective", None)  # noqa: SLF001
    assert objective_names(s) is None
    assert open_study(cfg).study_name == "old"  # same directions: continued as before
