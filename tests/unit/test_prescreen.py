"""The prescreen: a search on the simulator's landscape whose best configs the study launches first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tuner.config import TunerConfig
from tuner.errors import ConfigError
from tuner.memory import GPU_PROFILES, ModelShape
from tuner.precheck import passed_params
from tuner.prescreen import Pick, prescreen
from tuner.sim.landscape import evaluate
from tuner.space import defaults
from tuner.workload import build_requests

SMALL = [
    "+workload=chat",
    "objective=throughput",  # the default, capacity, is no landscape metric (refused below)
    "workload.num_requests=40",
    "workload.warmup_requests=2",
    "workload.arrival.concurrency=16",
    "workload.output_tokens.low=16",
    "workload.output_tokens.high=48",
]


def _run(cfg: TunerConfig) -> tuple[list[Pick], dict]:
    shape = ModelShape.from_dir(cfg.model.path)
    return prescreen(cfg, shape, build_requests(cfg.workload, Path(cfg.model.path)))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            ["workload.arrival.kind=poisson", "workload.arrival.rate=5"],
            "study.prescreen needs workload.arrival.kind=concurrency",
        ),
        (["engine.gpu=b200x"], "study.prescreen needs a GPU profile; engine.gpu is 'b200x'"),
        (["objective=latency"], "study.prescreen cannot predict ['e2e_p95_ms']"),
        (["workload.slo.e2e_ms=9000"], "study.prescreen cannot predict ['e2e_p95_ms']"),
        (["study.prescreen.top=0"], "study.prescreen is trials=30, top=0"),
        (
            ["objective=capacity"],
            "cannot predict ['capacity_rps'] (objectives or SLO constraints)"
            " (a capacity search per config; objective=goodput ranks by the SLOs too)",
        ),
    ],
)
def test_what_the_landscape_cannot_model_is_a_config_error(
    make_cfg: Callable[..., TunerConfig], override: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        make_cfg(*SMALL, "study.prescreen.trials=30", *override)
    assert message in str(err.value)


def test_off_by_default_and_no_check_when_off(make_cfg: Callable[..., TunerConfig]) -> None:
    cfg = make_cfg(*SMALL, "workload.arrival.kind=poisson", "workload.arrival.rate=5")
    assert cfg.study.prescreen.trials == 0  # a rate-based workload is fine without a prescreen


def test_picks_are_feasible_distinct_worst_of_two_streams_and_best_first(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    cfg = make_cfg(
        *SMALL, "objective=goodput", "study.prescreen.trials=40", "study.prescreen.top=3"
    )
    picks, summary = _run(cfg)
    assert 1 <= len(picks) <= 3 and summary["enqueued"] == len(picks)
    assert summary["trials"] == 40 and 0 < summary["feasible"] <= 40
    shape = ModelShape.from_dir(cfg.model.path)
    gpu = GPU_PROFILES[cfg.engine.gpu]
    w = cfg.workload
    baseline = passed_params(cfg.space, defaults(cfg.space))
    values = []
    for pick in picks:
        pr = pick.predicted
        assert pr["goodput"] == min(pr["goodput_stream1"], pr["goodput_stream2"]) > 0
        # the prediction is the landscape's own number for the first stream, re-computed here
        r = evaluate(
            shape,
            gpu,
            passed_params(cfg.space, pick.params),
            build_requests(w, Path(cfg.model.path)),
            concurrency=w.arrival.concurrency,
            slo=w.slo,
            system_prompt_tokens=w.system_prompt_tokens,
        )
        assert r.feasible and r.goodput == pytest.approx(pr["goodput_stream1"])
        assert passed_params(cfg.space, pick.params) != baseline  # the baseline trial covers those
        values.append(pr["goodput"])
    assert values == sorted(values, reverse=True)
    # two picks the simulator measures alike (within 1 %) would waste a launch
    for i, a in enumerate(values):
        for b in values[i + 1 :]:
            assert abs(a - b) > 0.01 * max(a, b)
    again, _ = _run(cfg)
    assert [p.params for p in again] == [p.params for p in picks]  # seeded


def test_pareto_objectives_pick_from_the_front(make_cfg: Callable[..., TunerConfig]) -> None:
    cfg = make_cfg(*SMALL, "study.prescreen.trials=30", "study.prescreen.top=2")
    picks, _ = _run(cfg)
    assert picks
    for pick in picks:  # throughput: output tok/s (max) and p95 TTFT (min), worst each
        pr = pick.predicted
        assert pr["output_throughput"] == min(
            pr["output_throughput_stream1"], pr["output_throughput_stream2"]
        )
        assert pr["ttft_p95_ms"] == max(pr["ttft_p95_ms_stream1"], pr["ttft_p95_ms_stream2"])


def test_a_space_with_nothing_that_starts_enqueues_nothing(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    cfg = make_cfg(
        *SMALL,
        "objective=goodput",
        "study.prescreen.trials=12",
        "space.params.gpu_memory_utilization.low=0.10",
        "space.params.gpu_memory_utilization.high=0.12",
        "space.params.gpu_memory_utilization.default=0.11",
        "space.params.max_model_len.choices=[40960]",
        "space.params.kv_cache_dtype.choices=[auto]",
        "space.params.quantization.choices=[null]",  # fp8 weights fit 8B in 12 % of an H200
    )
    picks, summary = _run(cfg)
    assert picks == [] and summary["feasible"] == 0 and summary["enqueued"] == 0


def test_no_capacity_prediction_on_a_gpu_the_speed_model_was_not_calibrated_on(
    make_cfg: Callable[..., TunerConfig],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the landscape's models were measured on an H200 and an H100 SXM: on another GPU (NVML's
    # name, no profile) it would predict their capacity, so it says none; on the H100 it predicts
    # (benchmarks/predicted_capacity.py: -4.5 % for chat's defaults at TPOT p95 <= 15 ms)
    import asyncio
    import logging

    import tuner.prescreen as prescreen_mod
    from tuner.memory import GpuProfile
    from tuner.precheck import LeasedGpu
    from tuner.prescreen import landscape_gpu, predict_start

    cfg = make_cfg("+workload=chat", *SMALL[2:])  # objective=capacity, the default
    shape = ModelShape.from_dir(cfg.model.path)
    requests = build_requests(cfg.workload, Path(cfg.model.path))
    params = defaults(cfg.space)
    gpu, _ = landscape_gpu(cfg)
    assert gpu is not None and gpu.name == "h200"  # the simulator's own GPU
    assert asyncio.run(predict_start(cfg, shape, requests, params)) is not None

    a100 = "GPU 0: NVIDIA A100-SXM4-80GB, 79.2 GiB (NVML)"
    leased = LeasedGpu(GpuProfile("NVIDIA A100-SXM4-80GB", 79.2), False, a100)
    monkeypatch.setattr(prescreen_mod, "gpu_of", lambda cfg: leased)
    assert landscape_gpu(cfg) == (None, a100)
    with caplog.at_level(logging.INFO, logger="tuner"):
        assert asyncio.run(predict_start(cfg, shape, requests, params)) is None
    (said,) = [r.getMessage() for r in caplog.records if "no capacity prediction" in r.getMessage()]
    assert "measured on h200, h100" in said and "NVIDIA A100-SXM4-80GB" in said
    # study.prescreen, asked for by name, still ranks on the H200's model and says so
    caplog.clear()
    ranked = make_cfg(*SMALL, "study.prescreen.trials=3")
    with caplog.at_level(logging.WARNING, logger="tuner"):
        _run(ranked)
    (warned,) = [r.getMessage() for r in caplog.records if "ranks configs" in r.getMessage()]
    assert "not calibrated on" in warned and "are an H200's" in warned
    h100 = "GPU 0: NVIDIA H100 80GB HBM3, 79.6 GiB (NVML)"
    measured = LeasedGpu(GpuProfile("h100", 79.65), True, h100)
    monkeypatch.setattr(prescreen_mod, "gpu_of", lambda cfg: measured)
    assert landscape_gpu(cfg) == (measured.profile, h100)
    assert asyncio.run(predict_start(cfg, shape, requests, params)) is not None


def test_image_requests_are_ranked_with_a_warning(
    make_cfg: Callable[..., TunerConfig], caplog: pytest.LogCaptureFixture
) -> None:
    # the landscape has no vision encoder: on image_heavy it predicted fp8 weights +31.6 % where
    # an H100 measured +0.6 % (docs/gpu-runs/2026-12-07-image-heavy-screen-h100.md)
    cfg = make_cfg(
        "+workload=image_heavy",
        "model=qwen3-vl-8b",
        "objective=throughput",
        "workload.num_requests=6",
        "workload.warmup_requests=1",
        "workload.arrival.concurrency=2",
        "workload.output_tokens.low=8",
        "workload.output_tokens.high=16",
        "study.prescreen.trials=1",
    )
    with caplog.at_level("WARNING", logger="tuner"):
        _run(cfg)
    assert any("no vision encoder" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="tuner"):
        _run(make_cfg(*SMALL, "study.prescreen.trials=1"))
    assert not any("no vision encoder" in r.getMessage() for r in caplog.records)
