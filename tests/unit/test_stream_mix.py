"""Stratified streams (tuner.workload.lengths, request_mix): a capacity step counts a few hundred
requests, and whatever the seed they carry the workload's mean lengths, so one config measures
one capacity in the search (workload.seed) and the confirm stage (confirm.seeds)."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tuner.workload.lengths as lengths
from tuner.capacity_probe import counted_mix
from tuner.config import DistConfig, ImageConfig, WorkloadConfig
from tuner.workload import build_requests, request_mix, sample_lengths
from tuner.workload.lengths import stratified_integers, stratified_uniforms

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "qwen3-8b-dummy"


def test_each_block_holds_one_value_per_stratum() -> None:
    u = stratified_uniforms(100, np.random.default_rng(0), block=16)
    assert len(u) == 100 and ((u > 0) & (u < 1)).all()
    for start in range(0, 96, 16):
        strata = np.floor(u[start : start + 16] * 16).astype(int)
        assert sorted(strata) == list(range(16))
    last = np.floor(u[96:] * 16).astype(int)  # a short last block: distinct strata
    assert len(set(last)) == 4
    # in random order, not sorted
    assert list(np.floor(u[:16] * 16).astype(int)) != list(range(16))


def test_stratified_integers_cover_the_range_evenly() -> None:
    values = stratified_integers(1, 4, 64, np.random.default_rng(5))
    assert sorted(set(values)) == [1, 2, 3, 4]
    for start in range(0, 64, 16):  # each block of 16 holds every value 4 times
        block = values[start : start + 16]
        assert [block.count(v) for v in (1, 2, 3, 4)] == [4, 4, 4, 4]


@pytest.mark.parametrize(
    "dist",
    [
        DistConfig(kind="uniform", low=64, high=192),
        DistConfig(kind="lognormal", mean=200, std=120, low=16, high=1024),
        DistConfig(kind="normal", mean=300, std=50, low=1, high=1000),
    ],
)
def test_a_window_of_whole_blocks_has_the_mean(
    dist: DistConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # windows of 160 values (10 blocks) over 20 seeds: the worst one's mean is within 3 % of the
    # distribution's, and at most half as far as the worst of independent draws (a block of 1)
    target = float(np.mean(sample_lengths(dist, 200_000, np.random.default_rng(1))))

    def worst() -> float:
        devs = []
        for seed in range(20):
            values = sample_lengths(dist, 320, np.random.default_rng(seed))
            devs += [abs(statistics.fmean(values[s : s + 160]) / target - 1) for s in (0, 160)]
        return max(devs)

    stratified = worst()
    monkeypatch.setattr(lengths, "BLOCK", 1)
    independent = worst()
    assert stratified < 0.03 and stratified < independent / 2, (stratified, independent)


def spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / statistics.fmean(xs)


# (workload, requests in flight, bound on the range over 10 seeds of the counted requests' mean
# text tokens, of their output tokens, of their images). Stratified in blocks of 16 (2026-12-05,
# benchmarks/capacity_streams.py): chat 2.6 / 0.8 %, long_docs 3.9 / 2.5 %, image_heavy 2.2 /
# 1.7 / 2.7 %; drawn independently (block 1): chat 7.4 / 4.3 %, long_docs 8.8 / 7.3 %,
# image_heavy 15.0 / 3.5 / 8.0 %, which moved chat's capacity on the simulator by 3 %.
BOUNDS = [
    ("chat", 470, 0.04, 0.02, None),
    ("long_docs", 24, 0.05, 0.035, None),
    ("image_heavy", 64, 0.04, 0.025, 0.04),
]


def ranges(make_cfg: Any, name: str, in_flight: int) -> list[float]:
    cfg = make_cfg(f"+workload={name}")
    text, out, images = [], [], []
    for seed in range(10):
        w = dataclasses.replace(cfg.workload, seed=seed)
        mix, counted = counted_mix(cfg.objective, w, in_flight / w.arrival.concurrency)
        tokens = mix.text_tokens()
        text.append(statistics.fmean(tokens[i] for i in counted))
        out.append(statistics.fmean(mix.output_tokens[i] for i in counted))
        if mix.images:
            images.append(statistics.fmean(mix.images[i] for i in counted))
    return [spread(text), spread(out), spread(images) if images else 0.0]


@pytest.mark.parametrize(("name", "in_flight", "text", "out", "images"), BOUNDS)
def test_a_capacity_step_counts_the_same_mix_whatever_the_seed(
    make_cfg: Any,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    in_flight: int,
    text: float,
    out: float,
    images: float | None,
) -> None:
    bounds = [text, out, images if images is not None else 1.0]
    got = ranges(make_cfg, name, in_flight)
    assert all(g <= b for g, b in zip(got, bounds, strict=True)), (got, bounds)
    # the bounds tell stratified streams from independent draws (a block of 1)
    monkeypatch.setattr(lengths, "BLOCK", 1)
    independent = ranges(make_cfg, name, in_flight)
    assert any(g > b for g, b in zip(independent, bounds, strict=True)), (independent, bounds)


def test_the_mix_is_what_the_stream_carries() -> None:
    # request_mix draws what build_requests builds, without the texts: the output tokens and the
    # images are the stream's, and the text tokens are its prompt less a constant per turn (the
    # template and the system prompt)
    w = WorkloadConfig(
        name="t",
        corpus=str(ROOT / "workloads" / "corpus.txt.gz"),
        num_requests=40,
        warmup_requests=3,
        turns=2,
        system_prompt_tokens=32,
        input_tokens=DistConfig(kind="lognormal", mean=60, std=30, low=4, high=400),
        output_tokens=DistConfig(kind="uniform", low=5, high=40),
    )
    specs = build_requests(w, MODEL)
    mix = request_mix(w)
    assert [s.output_tokens for s in specs] == mix.output_tokens
    assert mix.turn[:3] == [0, 1, 0] and mix.turn[3:7] == [0, 1, 0, 1]  # each part starts anew
    text = mix.text_tokens()
    for t in (0, 1):
        diffs = {specs[i].prompt_tokens - text[i] for i, x in enumerate(mix.turn) if x == t}
        assert len(diffs) == 1, (t, diffs)
    images = ImageConfig(min_count=0, max_count=2, sizes=[[28, 28], [56, 28]], formats=["png"])
    w = dataclasses.replace(w, turns=1, images=images)
    specs, mix = build_requests(w, MODEL), request_mix(w)
    assert [s.images for s in specs] == mix.images
    assert len(mix.image_sizes) == sum(mix.images)
