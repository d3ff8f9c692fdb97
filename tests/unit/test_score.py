from __future__ import annotations

import numpy as np
import pytest

from tuner.config import ObjectiveConfig, SLOConfig
from tuner.records import RequestRecord
from tuner.score import failure_values, objective_values, summarize


def rec(i: int, t: float, ttft: float, e2e: float, out: int, **kw) -> RequestRecord:
    return RequestRecord(
        index=i,
        status=kw.pop("status", "ok"),
        t_sent_s=t,
        ttft_s=ttft,
        itl_s=kw.pop("itl", (0.01,)),
        e2e_s=e2e,
        prompt_tokens=100,
        output_tokens=out,
        **kw,
    )


def test_summary_matches_bench_serve_definitions() -> None:
    records = [
        rec(0, 0.0, 0.1, 1.1, 11),
        rec(1, 0.5, 0.3, 2.3, 21),
        rec(2, 1.0, 0.2, 1.0, 9, itl=(0.02, 0.04)),
        RequestRecord(index=3, status="error", t_sent_s=1.0, error="boom", http_status=500),
        rec(9, 0.0, 5.0, 9.0, 100, warmup=True),  # excluded
    ]
    m = summarize(records, SLOConfig(ttft_ms=250, tpot_ms=None))
    duration = 2.8  # first send 0.0 → last completion 0.5 + 2.3
    assert m["duration_s"] == pytest.approx(duration)
    assert m["output_throughput"] == pytest.approx(41 / duration)
    assert m["request_throughput"] == pytest.approx(3 / duration)
    assert m["success_rate"] == pytest.approx(0.75) and m["failed"] == 1
    assert m["ttft_p95_ms"] == pytest.approx(np.percentile([100, 300, 200], 95))
    assert m["tpot_mean_ms"] == pytest.approx(np.mean([100.0, 100.0, 100.0]))
    assert m["goodput"] == pytest.approx(2 / duration)  # the 300 ms TTFT misses the SLO
    assert m["itl_p50_ms"] == pytest.approx(np.percentile([10, 10, 20, 40], 50))


def test_no_success_gives_zero_throughput_and_worst_values() -> None:
    m = summarize([RequestRecord(index=0, status="timeout", t_sent_s=0.0)], SLOConfig())
    assert m["output_throughput"] == 0.0 and m["error_rate"] == 1.0
    obj = ObjectiveConfig()
    assert objective_values(m, obj) == (0.0, failure_values(obj)[1])
