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
    ],
)
def test_semantic_errors(make_cfg, override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make_cfg("+workload=chat", override)
