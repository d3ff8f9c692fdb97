"""The dry-run plan's estimate of how much of the space the precheck refuses."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tuner.plan import print_plan, refusal_shares


def test_refusal_shares_of_the_default_space(make_cfg) -> None:
    shares = refusal_shares(make_cfg("+workload=chat"), draws=400)
    # chunked prefill off with max_num_batched_tokens < max_model_len: a large share of the
    # default space; every share is a fraction of the draws
    assert 0.1 < shares["invalid_config"] < 0.6
    assert all(0 < v <= 1 for v in shares.values())
    assert sum(shares.values()) <= 1.0
    assert shares == refusal_shares(make_cfg("+workload=chat"), draws=400)  # seeded


def test_a_space_that_cannot_start_is_named(make_cfg) -> None:
    cfg = make_cfg(
        "+workload=chat",
        "space.params.gpu_memory_utilization.low=0.10",
        "space.params.gpu_memory_utilization.high=0.11",  # not even the weights fit
    )
    shares = refusal_shares(cfg, draws=200)
    assert sum(shares.values()) == pytest.approx(1.0)  # vLLM's validation speaks first
    assert set(shares) == {"no_kv_memory", "invalid_config"}
    buf = io.StringIO()
    print_plan(cfg, Console(file=buf, width=300))
    out = buf.getvalue()
    assert "precheck: refuses 100% of 1000 random configs from this space (no_kv_memory" in out
    assert "note: 100% of the space cannot start; narrow space.params" in out


def test_no_estimate_without_the_precheck(make_cfg) -> None:
    buf = io.StringIO()
    print_plan(make_cfg("+workload=chat", "study.precheck=false"), Console(file=buf, width=300))
    assert "precheck: refuses" not in buf.getvalue()
