from __future__ import annotations

import pytest

from tuner.config import TunerConfig, available
from tuner.errors import ConfigError


@pytest.mark.parametrize("workload", available("workload"))
@pytest.mark.parametrize("engine", ["sim", "vllm"])
def test_every_workload_composes(make_cfg, workload: str, engine: str) -> None:
    cfg = make_cfg(f"+workload={workload}", f"engine={engine}")
    assert isinstance(cfg, TunerConfig)
    assert cfg.workload.name == workload
    assert cfg.engine.kind == engine


def test_confirm_defaults_include_the_baseline_and_rounds(make_cfg) -> None:
    cc = make_cfg("+workload=chat").confirm
    assert cc.picks[-1] == "baseline" and cc.rounds == 3 and cc.min_effect == 0.03


def test_workloads_exist() -> None:
    assert {"chat", "long_docs", "image_heavy"} <= set(available("workload"))


def test_missing_workload_is_one_line(make_cfg) -> None:
    with pytest.raises(ConfigError, match=r"\+workload=NAME \(one of: .*chat"):
        make_cfg()


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("engine.host=0.0.0.0", "loopback"),
        ("study.sampler=bogus", "tpe"),
        ("objective.objectives.0.metric=speed", "output_throughput"),
        ("workload.arrival.kind=storm", "poisson"),
        ("model.path=/nonexistent", "config.json"),
        ("study.max_rejected=-1", r"study.max_rejected is -1; allowed: an integer >= 0"),
        ("confirm.rounds=0", r"confirm.rounds is 0; allowed: an integer >= 1"),
        ("confirm.min_effect=-0.1", r"confirm.min_effect is -0.1; allowed: 0.0"),
    ],
)
def test_semantic_errors(make_cfg, override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make_cfg("+workload=chat", override)


@pytest.mark.parametrize("space", available("space"))
@pytest.mark.parametrize("study", available("study"))
def test_every_space_and_study_option_composes(make_cfg, space: str, study: str) -> None:
    cfg = make_cfg("+workload=chat", f"space={space}", f"study={study}", "engine.gpus=[0,1]")
    if space == "none":  # repeated measurements of vLLM's defaults
        assert cfg.space.params == {}
    else:
        assert cfg.space.params["gpu_memory_utilization"].default == 0.92
    assert cfg.study.sampler in ("tpe", "random", "gp", "nsga2", "grid")


@pytest.mark.parametrize("objective", available("objective"))
def test_every_objective_composes(make_cfg, objective: str) -> None:
    cfg = make_cfg("+workload=chat", f"objective={objective}")
    assert cfg.objective.objectives


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [  # two mistakes: the first check in tuner.checks.CHECKS names its own
        (
            ["engine.cpu_pinning=true", "engine.cpu_reserve=999", "study.sampler=bogus"],
            "cpu_pinning",
        ),
        (["study.prescreen.top=0", "objective.objectives.0.metric=speed"], "study.prescreen"),
        (["objective.objectives.0.metric=speed", "confirm.seeds=[]"], "objective metric"),
        (["workload.client_loop=nope", "workload.arrival.kind=storm"], "workload.client_loop"),
        (["model.path=/nonexistent", "space.params.max_num_seqs.low=0"], "config.json"),
    ],
)
def test_checks_run_in_order(make_cfg, overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make_cfg("+workload=chat", *overrides)
