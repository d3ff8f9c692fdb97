from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import FailureReason, TrialFailed
from tuner.memory import ModelShape
from tuner.records import RequestSpec
from tuner.study import _precheck

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ModelShape.from_dir(ROOT / "models" / "qwen3-8b-dummy")  # 32 attention heads


def spec(n: int) -> RequestSpec:
    return RequestSpec(index=0, endpoint="chat", body={}, prompt_tokens=n, output_tokens=100)


@pytest.mark.parametrize(
    ("gpus", "params", "needle"),
    [
        ([0], {"tensor_parallel_size": 2}, "exceeds the GPU lease"),
        ([0, 1, 2], {"tensor_parallel_size": 3}, "does not divide the 32"),
        ([0], {"max_model_len": 4096}, "max_model_len 4096 is shorter"),
    ],
)
def test_certain_failures_are_rejected_before_launch(make_cfg, gpus, params, needle) -> None:
    cfg = make_cfg("+workload=chat", f"engine.gpus={gpus}")
    with pytest.raises(TrialFailed) as e:
        _precheck(cfg, SHAPE, params, [spec(8000), spec(300)] * 5)
    assert e.value.reason is FailureReason.PRECHECK
    assert needle in e.value.detail


def test_feasible_params_pass(make_cfg) -> None:
    cfg = make_cfg("+workload=chat", "engine.gpus=[0,1]")
    _precheck(cfg, SHAPE, {"tensor_parallel_size": 2, "max_model_len": 16384}, [spec(8000)])
