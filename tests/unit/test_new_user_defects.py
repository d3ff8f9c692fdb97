"""Defects a new user met (issue #29): the precheck ignored ``model.fixed_args``; "Recommended:"
named another pick's file when vLLM's defaults won under every pick."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.models import DEFAULTS, SHAPE
from rich.console import Console

from tuner.config import TunerConfig
from tuner.console import print_confirm
from tuner.engine.argv import fixed_note, fixed_params
from tuner.precheck import precheck
from tuner.records import Candidate

FIXED = ["+model.fixed_args.gpu-memory-utilization=0.352", "+model.fixed_args.kv-cache-dtype=fp8"]


def test_the_precheck_predicts_with_the_fixed_flags(make_cfg: Callable[..., TunerConfig]) -> None:
    cfg = make_cfg("+workload=chat", "space=full", *FIXED)
    assert fixed_params(cfg.model) == {"gpu_memory_utilization": 0.352, "kv_cache_dtype": "fp8"}
    # the baseline passes no searched flag: the fixed ones hold (vLLM logged 473,216 tokens on
    # the H200; 817,184 was predicted with vLLM's defaults in their place)
    v = precheck(cfg, SHAPE, DEFAULTS, [], baseline=True)
    assert v.kv_tokens == pytest.approx(473_216, rel=0.01)
    # a searched flag follows the fixed ones on the command line: it wins
    plain = precheck(make_cfg("+workload=chat", "space=full"), SHAPE, DEFAULTS, [])
    assert precheck(cfg, SHAPE, DEFAULTS, []).kv_tokens == plain.kv_tokens


def test_no_kv_flags_in_fixed_args_change_nothing(make_cfg: Callable[..., TunerConfig]) -> None:
    cfg = make_cfg("+workload=chat", "+model.fixed_args.no-enable-log-requests=true")
    assert fixed_params(cfg.model) == {"enable_log_requests": False}  # --no-x: x false
    plain = precheck(make_cfg("+workload=chat", "space=full"), SHAPE, DEFAULTS, [], baseline=True)
    assert precheck(cfg, SHAPE, DEFAULTS, [], baseline=True).kv_tokens == plain.kv_tokens


def test_the_start_line_names_the_fixed_flags(make_cfg: Callable[..., TunerConfig]) -> None:
    # on the H200 a study with +model.fixed_args.quantization=fp8 labelled its one trial
    # "(vLLM defaults)" (the searched params); the study's first line now says what else ran
    cfg = make_cfg(
        "+workload=chat",
        "+model.fixed_args.quantization=fp8",
        "+model.fixed_args.api-key=s3",
        "+model.fixed_args.hf-token=s4",
    )
    assert fixed_note(cfg.model) == "; every server also runs with quantization=fp8"
    tokens = make_cfg("+workload=chat", "+model.fixed_args.max-num-batched-tokens=4096").model
    assert fixed_note(tokens) == "; every server also runs with max_num_batched_tokens=4096"
    assert fixed_note(make_cfg("+workload=chat", "space=full").model) == ""
    # and the precheck predicts its KV cache with fp8 weights (vLLM logged 861,024 tokens)
    v = precheck(cfg, SHAPE, DEFAULTS, [], baseline=True)
    assert v.kv_tokens == pytest.approx(861_024, rel=0.01)


def test_the_baseline_winning_every_pick_recommends_best_baseline(tmp_path: Path) -> None:
    picks = ("goodput", "latency", "knee", "baseline")
    base = Candidate(0, picks, {}, True, (), {})
    console = Console(record=True, width=300)
    print_confirm([], [base], base, tmp_path, console, list(picks), None)
    text = console.export_text()
    assert f"vllm serve --config {tmp_path / 'best-baseline.yaml'}" in text
    other = Candidate(3, ("latency", "knee"), {}, False, (), {})
    console = Console(record=True, width=300)
    print_confirm([], [other, base], other, tmp_path, console, list(picks), None)
    assert f"{tmp_path / 'best-latency.yaml'}" in console.export_text()
