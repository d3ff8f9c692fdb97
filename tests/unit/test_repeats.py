"""``study.repeats``: several replays of one trial become one result."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.checks import load_config
from tuner.records import TrialResult
from tuner.score import mean_result


@pytest.fixture(scope="module")
def cfg() -> Any:
    return load_config(["+workload=chat", "objective=goodput", "paths.output_dir=/tmp/unused"])


def res(goodput: float, tok_s: float, **kw: Any) -> TrialResult:
    m = {"goodput": goodput, "output_throughput": tok_s, "error_rate": 0.0, "ttft_p95_ms": 900.0}
    return TrialResult(number=1, params={}, argv=(), values=(goodput,), constraints={},
                       metrics=m, **kw)  # fmt: skip


def test_mean_of_the_repeats_with_objectives_recomputed(cfg: Any) -> None:
    out = mean_result(
        [res(20.5, 7700), res(17.5, 7900), res(18.0, 7800)], cfg.objective, cfg.workload.slo
    )
    assert out.metrics["goodput"] == pytest.approx(18.6667, rel=1e-4)
    assert out.values == (pytest.approx(18.6667, rel=1e-4),)
    assert out.metrics["goodput_spread"] == pytest.approx(3.0 / 18.6667, rel=1e-4)
    assert out.metrics["output_throughput_spread"] == pytest.approx(200 / 7800)
    assert out.metrics["repeats"] == 3
    assert out.constraints["error_rate"] == pytest.approx(-0.05)


def test_a_failure_or_a_prune_decides(cfg: Any) -> None:
    dead = res(0.0, 0.0, failure_reason="engine_dead", failure_detail="boom")
    assert mean_result([res(20, 7000), dead], cfg.objective, cfg.workload.slo) is dead
    pruned = res(1.0, 100.0, pruned="TTFT SLO lost")
    assert mean_result([pruned], cfg.objective, cfg.workload.slo) is pruned
    one = res(5, 500)
    assert mean_result([one], cfg.objective, cfg.workload.slo) is one
