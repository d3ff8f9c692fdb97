"""tuner.workload: deterministic, token-exact request streams."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tuner.config import ArrivalConfig, DistConfig, ImageConfig, WorkloadConfig
from tuner.errors import ConfigError
from tuner.workload import (
    TokenCorpus,
    arrival_gaps,
    arrival_times,
    build_requests,
    image_tokens,
    load_tokenizer,
    ramp_rate,
    sample_lengths,
    token_corpus,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "qwen3-8b-dummy"
CORPUS = ROOT / "workloads" / "corpus.txt.gz"


def wl(**kw: Any) -> WorkloadConfig:
    base: dict[str, Any] = {
        "name": "t",
        "corpus": str(CORPUS),
        "num_requests": 12,
        "input_tokens": DistConfig(kind="uniform", low=20, high=400),
        "output_tokens": DistConfig(kind="uniform", low=5, high=50),
    }
    base.update(kw)
    return WorkloadConfig(**base)


def count(text: str) -> int:
    return len(load_tokenizer(MODEL).encode(text, add_special_tokens=False).ids)


def chatml(messages: list[dict[str, Any]]) -> str:
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = "".join(p["text"] for p in content if p["type"] == "text")
        out.append(f"<|im_start|>{m['role']}\n{content}<|im_end|>\n")
    return "".join(out) + "<|im_start|>assistant\n"


def user_text(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p["type"] == "text")


def test_corpus_shipped_and_large() -> None:
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        assert len(f.read()) > 1_000_000
    assert (ROOT / "workloads" / "README.md").is_file()


def test_same_seed_same_bodies_different_seed_differs() -> None:
    a = build_requests(wl(seed=1, warmup_requests=2), MODEL)
    b = build_requests(wl(seed=1, warmup_requests=2), MODEL)
    c = build_requests(wl(seed=2, warmup_requests=2), MODEL)
    dump = lambda specs: [json.dumps(s.body, sort_keys=True) for s in specs]  # noqa: E731
    assert dump(a) == dump(b)
    assert [s.prompt_tokens for s in a] == [s.prompt_tokens for s in b]
    assert dump(a) != dump(c)
    assert len(set(dump(a))) == len(a)  # requests differ from each other


def test_warmup_then_measured() -> None:
    specs = build_requests(wl(warmup_requests=3, num_requests=5), MODEL)
    assert [s.warmup for s in specs] == [True] * 3 + [False] * 5
    assert [s.index for s in specs] == list(range(8))
    assert all(s.arrival_s is None for s in specs)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("target", [1, 37, 500, 2500])
def test_token_exact_prompts(endpoint: str, target: int) -> None:
    w = wl(endpoint=endpoint, num_requests=10, input_tokens=DistConfig(kind="fixed", mean=target))
    specs = build_requests(w, MODEL)
    tok = load_tokenizer(MODEL)
    exact = 0
    for s in specs:
        assert s.endpoint == endpoint
        assert s.body["ignore_eos"] is True
        assert s.body["max_tokens"] == s.output_tokens
        if endpoint == "chat":
            (msg,) = s.body["messages"]
            n = count(user_text(msg))
            server = len(tok.encode(chatml(s.body["messages"]), add_special_tokens=False).ids)
        else:
            n = count(s.body["prompt"])
            server = len(tok.encode(s.body["prompt"], add_special_tokens=True).ids)
        assert s.prompt_tokens == server  # what the server counts, framing included
        if endpoint == "chat":
            assert s.prompt_tokens > n  # ChatML framing counted
        assert abs(n - target) <= target // 100
        exact += n == target
    assert exact >= 9  # usually exact


def test_varied_lengths_token_exact() -> None:
    w = wl(
        endpoint="completions",
        num_requests=30,
        input_tokens=DistConfig(kind="lognormal", mean=300, std=250, low=1, high=3000),
    )
    specs = build_requests(w, MODEL)
    counts = [count(s.body["prompt"]) for s in specs]
    assert len(set(counts)) > 20
    assert [s.prompt_tokens for s in specs] == counts  # no special tokens added by this model


def test_token_corpus_windows_exact() -> None:
    corpus = token_corpus(MODEL, CORPUS)
    rng = np.random.default_rng(7)
    targets = [1, 2, 3, 17, 128, 1000, 4096]
    for n in targets:
        text = corpus.text(n, rng)
        assert abs(count(text) - n) <= n // 100
    assert corpus.text(0, rng) == ""


def test_token_corpus_fits_a_batch_as_one_window_at_a_time() -> None:
    """``texts`` fits all its windows in batches (one encode per round for all of them); each
    window is the one ``text`` cuts from the same offset, token-exact, and a fit is cached."""
    corpus = token_corpus(MODEL, CORPUS)
    rng = np.random.default_rng(11)
    slots = [(corpus.offset(rng), int(n)) for n in rng.integers(1, 900, size=60)] + [(5, 0)]
    batch = corpus.texts(slots)
    assert batch[-1] == ""
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        alone = TokenCorpus(corpus.tokenizer, f.read())
    for (offset, n), text in zip(slots[:-1], batch, strict=False):
        assert abs(count(text) - n) <= n // 100
        assert alone.texts([(offset, n)]) == [text]  # no cache: fitted by itself
    assert all(count(t) == n for (_, n), t in zip(slots, batch, strict=True))
    # at one offset each, the length correction makes more windows exact (224 and 277 of 300
    # with 1 and 8 attempts when written)
    exact = [
        sum(count(corpus.texts([(o, n)], attempts=k, offsets=1)[0]) == n for o, n in slots[:-1])
        for k in (1, 8)
    ]
    assert exact[1] > exact[0]


def test_segment_counts_match_encoding_each_text_alone() -> None:
    """The batched prompt counts of build_requests equal encoding each prompt by itself, pieces
    cached or not (a chat prompt split at the template's specials)."""
    from tuner.workload.prompts import SegmentEncoder

    tok = load_tokenizer(MODEL)
    corpus = token_corpus(MODEL, CORPUS)
    rng = np.random.default_rng(3)
    parts = corpus.texts([(corpus.offset(rng), 50) for _ in range(6)])
    prompts = [
        f"<|im_start|>system\n{parts[0]}<|im_end|>\n<|im_start|>user\n{p}<|im_end|>\n"
        "<|im_start|>assistant\n"
        for p in parts[1:]
    ] + ["no specials at all", ""]
    want = [len(tok.encode(p, add_special_tokens=False).ids) for p in prompts]
    seg = SegmentEncoder(tok, max_entries=4)  # smaller than the pieces: the cache is cleared
    assert seg.split is not None
    assert seg.counts(prompts) == want
    assert seg.counts(prompts[::-1]) == want[::-1]  # cached pieces count the same
    assert [len(seg.encode(p)) for p in prompts] == want


def test_chat_system_prompt_shared() -> None:
    specs = build_requests(wl(system_prompt_tokens=200, num_requests=6), MODEL)
    systems = {s.body["messages"][0]["content"] for s in specs}
    assert len(systems) == 1
    assert all(s.body["messages"][0]["role"] == "system" for s in specs)
    assert count(next(iter(systems))) == 200
    users = {user_text(s.body["messages"][1]) for s in specs}
    assert len(users) == 6


def test_multi_turn_structure() -> None:
    w = wl(turns=3, num_requests=7, system_prompt_tokens=16)
    specs = build_requests(w, MODEL)
    roles = [[m["role"] for m in s.body["messages"]] for s in specs]
    one = ["system", "user"]
    two = [*one, "assistant", "user"]
    three = [*two, "assistant", "user"]
    assert roles == [one, two, three, one, two, three, one]
    for prev, cur in zip(specs[:2], specs[1:3], strict=True):
        # turn k carries turn k-1's messages verbatim plus an assistant reply of its output size
        assert cur.body["messages"][: len(prev.body["messages"])] == prev.body["messages"]
        reply = cur.body["messages"][len(prev.body["messages"])]
        assert reply["role"] == "assistant"
        assert abs(count(reply["content"]) - prev.output_tokens) <= max(
            1, prev.output_tokens // 100
        )
        assert cur.prompt_tokens > prev.prompt_tokens + prev.output_tokens
    assert specs[3].body["messages"][1] != specs[0].body["messages"][1]


def test_multi_turn_completions_concatenates() -> None:
    specs = build_requests(wl(endpoint="completions", turns=2, num_requests=2), MODEL)
    assert specs[1].body["prompt"].startswith(specs[0].body["prompt"] + "\n\n")


def decode_image(url: str) -> tuple[str, Image.Image]:
    head, b64 = url.split(",", 1)
    assert head.startswith("data:image/")
    assert head.endswith(";base64")
    img = Image.open(io.BytesIO(base64.b64decode(b64)))
    img.load()
    return head[len("data:image/") : -len(";base64")], img


def test_images_from_config() -> None:
    im = ImageConfig(min_count=1, max_count=3, sizes=[[64, 48], [100, 30]], formats=["jpeg", "png"])
    specs = build_requests(wl(images=im, num_requests=20), MODEL)
    seen_formats, seen_sizes, pixels = set(), set(), set()
    for s in specs:
        (msg,) = s.body["messages"]
        parts = msg["content"]
        assert parts[0]["type"] == "text"
        imgs = [p["image_url"]["url"] for p in parts[1:]]
        assert all(p["type"] == "image_url" for p in parts[1:])
        assert 1 <= len(imgs) <= 3
        assert s.images == len(imgs)
        est = 0
        for url in imgs:
            fmt, img = decode_image(url)
            assert img.format == fmt.upper()
            seen_formats.add(fmt)
            seen_sizes.add(img.size)
            pixels.add(img.convert("RGB").tobytes())
            est += image_tokens(*img.size)
        text_only = len(load_tokenizer(MODEL).encode(chatml([msg]), add_special_tokens=False).ids)
        assert s.prompt_tokens == text_only + est
    assert seen_formats == {"jpeg", "png"}
    assert seen_sizes == {(64, 48), (100, 30)}
    n_images = sum(s.images for s in specs)
    assert len(pixels) == n_images  # every image differs


def test_image_tokens_estimate() -> None:
    assert image_tokens(28, 28) == 1
    assert image_tokens(29, 28) == 2
    assert image_tokens(1024, 768) == 37 * 28


def test_images_need_chat() -> None:
    with pytest.raises(ConfigError):
        build_requests(wl(endpoint="completions", images=ImageConfig()), MODEL)


def test_missing_corpus_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="corpus"):
        build_requests(wl(corpus=str(tmp_path / "nope.txt")), MODEL)


@pytest.mark.parametrize(
    ("dist", "check"),
    [
        (DistConfig(kind="fixed", mean=77, low=1, high=100), lambda v: set(v) == {77}),
        (DistConfig(kind="fixed", mean=500, low=1, high=100), lambda v: set(v) == {100}),
        (DistConfig(kind="uniform", low=10, high=20), lambda v: set(v) == set(range(10, 21))),
        (
            DistConfig(kind="normal", mean=100, std=20, low=90, high=1000),
            lambda v: min(v) == 90 and abs(np.mean(v) - 103) < 5,
        ),
        (
            DistConfig(kind="lognormal", mean=200, std=100, low=1, high=100_000),
            lambda v: abs(np.mean(v) - 200) < 10 and abs(np.std(v) - 100) < 15,
        ),
    ],
)
def test_length_distributions(dist: DistConfig, check: Any) -> None:
    values = sample_lengths(dist, 5000, np.random.default_rng(3))
    assert all(isinstance(v, int) for v in values)
    assert all(dist.low <= v <= dist.high for v in values)
    assert check(values)


def test_poisson_mean_gap() -> None:
    gaps = arrival_gaps(ArrivalConfig(kind="poisson", rate=8.0), 20_000, np.random.default_rng(0))
    assert abs(gaps.mean() - 1 / 8) < 0.05 / 8
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # exponential: CV 1


def test_gamma_burstiness_changes_variance() -> None:
    rng = np.random.default_rng(0)
    bursty = arrival_gaps(ArrivalConfig(kind="gamma", rate=4.0, burstiness=0.25), 20_000, rng)
    smooth = arrival_gaps(ArrivalConfig(kind="gamma", rate=4.0, burstiness=4.0), 20_000, rng)
    for g in (bursty, smooth):
        assert abs(g.mean() - 0.25) < 0.025
    # CV = 1/sqrt(shape): 2.0 for burstiness 0.25, 0.5 for 4
    assert abs(bursty.std() / bursty.mean() - 2.0) < 0.2
    assert abs(smooth.std() / smooth.mean() - 0.5) < 0.05


def test_constant_gaps_exact() -> None:
    times = arrival_times(ArrivalConfig(kind="constant", rate=4.0), 9, np.random.default_rng(0))
    assert times == pytest.approx([i * 0.25 for i in range(9)], abs=1e-12)
    assert arrival_times(ArrivalConfig(kind="concurrency"), 9, np.random.default_rng(0)) is None


def test_open_loop_specs_have_increasing_arrivals() -> None:
    w = wl(arrival=ArrivalConfig(kind="poisson", rate=10.0), warmup_requests=2, num_requests=10)
    specs = build_requests(w, MODEL)
    assert [s.arrival_s for s in specs[:2]] == [None, None]
    arr = [s.arrival_s for s in specs[2:]]
    assert arr[0] == 0.0
    assert all(a is not None and b is not None and b > a for a, b in zip(arr, arr[1:]))  # noqa: B905


# --- per-profile statistics and the ramp schedule ----------------------------------------------


def profile(make_cfg: Any, name: str) -> WorkloadConfig:
    return make_cfg(f"+workload={name}").workload


def dist_mean(d: DistConfig) -> float:
    """The mean of ``d`` before clipping (uniform: the midpoint)."""
    return (d.low + d.high) / 2 if d.kind == "uniform" else d.mean


@pytest.mark.parametrize("name", ["chat", "long_docs", "image_heavy"])
def test_profile_length_statistics(make_cfg: Any, name: str) -> None:
    w = profile(make_cfg, name)
    rng = np.random.default_rng(11)
    for d in (w.input_tokens, w.output_tokens):
        values = np.asarray(sample_lengths(d, 20_000, rng))
        assert values.min() >= d.low
        assert values.max() <= d.high
        # clipping moves a lognormal's mean a little; 5 % covers it for the shipped profiles
        assert abs(values.mean() - dist_mean(d)) <= 0.05 * dist_mean(d)
        if d.kind == "uniform":  # the whole range is used
            width = d.high - d.low
            assert values.min() <= d.low + 0.01 * width
            assert values.max() >= d.high - 0.01 * width


def test_image_heavy_images_per_request(make_cfg: Any) -> None:
    w = profile(make_cfg, "image_heavy")
    assert w.images is not None
    lo, hi = w.images.min_count, w.images.max_count
    small = dataclasses.replace(w.images, sizes=[[28, 28], [56, 28]])
    fast = dataclasses.replace(
        w, images=small, num_requests=120, warmup_requests=0, input_tokens=DistConfig(mean=8)
    )
    specs = build_requests(fast, MODEL)
    counts = np.array([s.images for s in specs])
    assert counts.min() >= lo
    assert counts.max() <= hi
    assert set(counts.tolist()) == set(range(lo, hi + 1))
    assert abs(counts.mean() - (lo + hi) / 2) < 0.35


def test_trace_profile_statistics(make_cfg: Any) -> None:
    w = profile(make_cfg, "trace")
    specs = build_requests(dataclasses.replace(w, warmup_requests=0), MODEL)
    assert len(specs) == 200
    outs = np.array([s.output_tokens for s in specs])
    assert outs.min() >= 8
    assert outs.max() <= 1024
    assert abs(outs.mean() - 180) < 25  # the sample's log-normal mean 180
    arr = np.array([s.arrival_s for s in specs])
    assert arr[0] == 0.0
    assert np.all(np.diff(arr) >= 0)
    gaps = np.diff(arr)
    assert gaps.std() / gaps.mean() > 1.2  # bursty: more variable than Poisson (CV 1)


@pytest.mark.parametrize(
    ("arrival", "rate"),
    [
        (ArrivalConfig(kind="poisson", rate=8.0), 8.0),
        (ArrivalConfig(kind="gamma", rate=3.0, burstiness=0.5), 3.0),
        (ArrivalConfig(kind="constant", rate=20.0), 20.0),
    ],
)
def test_arrival_rates(arrival: ArrivalConfig, rate: float) -> None:
    times = np.array(arrival_times(arrival, 20_001, np.random.default_rng(5)))
    assert abs(20_000 / times[-1] - rate) < 0.03 * rate


def ramp(start: float, end: float, burstiness: float = 1.0) -> ArrivalConfig:
    return ArrivalConfig(
        kind="ramp", ramp_start_rate=start, ramp_end_rate=end, burstiness=burstiness
    )


@pytest.mark.parametrize(("start", "end"), [(2.0, 20.0), (30.0, 5.0), (0.0, 10.0)])
def test_ramp_rate_linear_in_time(start: float, end: float) -> None:
    a = ramp(start, end)
    n = 40_000
    times = np.array(arrival_times(a, n, np.random.default_rng(1)))
    span = 2 * (n - 1) / (start + end)
    assert times[0] == 0.0
    assert np.all(np.diff(times) >= 0)
    # the expected count in each tenth of the ramp is the integral of the linear rate
    edges = np.linspace(0, span, 11)
    counts, _ = np.histogram(times, edges)
    for k in range(10):
        mid = (edges[k] + edges[k + 1]) / 2
        expected = ramp_rate(a, n, mid) * (edges[k + 1] - edges[k])
        assert abs(counts[k] - expected) < 0.08 * expected + 30
    assert ramp_rate(a, n, 0.0) == start
    assert ramp_rate(a, n, span) == end
    assert ramp_rate(a, n, span / 2) == pytest.approx((start + end) / 2)


def test_ramp_smooth_is_nearly_deterministic() -> None:
    times = arrival_times(ramp(0.0, 10.0, burstiness=1e9), 6, np.random.default_rng(0))
    assert times is not None
    # rate 10 t over 1 s: L(t) = 5 t^2, so request i is due at sqrt(i / 5)
    assert times == pytest.approx([(i / 5) ** 0.5 for i in range(6)], abs=1e-3)


def test_ramp_gaps_match_times() -> None:
    a = ramp(1.0, 9.0)
    gaps = arrival_gaps(a, 5, np.random.default_rng(4))
    times = arrival_times(a, 6, np.random.default_rng(4))
    assert times is not None
    assert np.cumsum(gaps) == pytest.approx(times[1:])


def test_ramp_specs_and_determinism() -> None:
    w = wl(arrival=ramp(5.0, 50.0), num_requests=10, seed=9)
    a = [s.arrival_s for s in build_requests(w, MODEL)]
    b = [s.arrival_s for s in build_requests(w, MODEL)]
    assert a == b
    assert a[0] == 0.0
    assert all(x is not None and y is not None and y >= x for x, y in zip(a, a[1:]))  # noqa: B905


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["workload.arrival.kind=ramp", "workload.arrival.ramp_end_rate=5"],
            "workload.arrival.ramp_start_rate is None; allowed: >= 0 requests/s",
        ),
        (
            ["workload.arrival.kind=ramp", "workload.arrival.ramp_start_rate=1"],
            "workload.arrival.ramp_end_rate is None; allowed: > 0 requests/s",
        ),
        (
            [
                "workload.arrival.kind=ramp",
                "workload.arrival.ramp_start_rate=1",
                "workload.arrival.ramp_end_rate=0",
            ],
            "workload.arrival.ramp_end_rate is 0.0; allowed: > 0 requests/s",
        ),
        (
            ["workload.arrival.kind=storm"],
            "workload.arrival.kind is 'storm'; allowed: concurrency, poisson, gamma, constant, ramp",
        ),
    ],
)
def test_arrival_config_errors(make_cfg: Any, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_cfg("+workload=chat", *overrides)
    assert str(info.value) == message


def test_ramp_config_composes(make_cfg: Any) -> None:
    cfg = make_cfg(
        "+workload=chat",
        "workload.arrival.kind=ramp",
        "workload.arrival.ramp_start_rate=1",
        "workload.arrival.ramp_end_rate=40",
    )
    assert cfg.workload.arrival.kind == "ramp"


def test_image_tokens_follow_the_models_processor_grid() -> None:
    """Qwen3-VL (patch 16 x merge 2): the counts vLLM 0.24's own multimodal processor gives for
    the dummy model directory (scripts/check_vl_model.py, run on CPU): 256, 768, 768, 880."""
    from tuner.workload.images import model_image_grid

    root = Path(__file__).resolve().parents[2] / "models"
    grid = model_image_grid(root / "qwen3-vl-8b-dummy")
    assert grid is not None and grid.factor == 32
    sizes = [(512, 512), (1024, 768), (768, 1024), (1280, 720)]
    assert [image_tokens(w, h, grid) for w, h in sizes] == [256, 768, 768, 880]
    assert image_tokens(8192, 8192, grid) == 16384  # capped at max_pixels (longest_edge)
    assert model_image_grid(root / "qwen3-8b-dummy") is None  # no processor: the estimate
