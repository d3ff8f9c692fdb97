"""tuner.workload: deterministic, token-exact request streams."""

from __future__ import annotations

import base64
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
    arrival_gaps,
    arrival_times,
    build_requests,
    image_tokens,
    load_tokenizer,
    sample_lengths,
    token_corpus,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "qwen3-8b-dummy"
CORPUS = ROOT / "workloads" / "corpus.txt"


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
    assert CORPUS.stat().st_size > 1_000_000
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
