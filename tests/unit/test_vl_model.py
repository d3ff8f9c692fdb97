"""models/qwen3-vl-8b-dummy: the Qwen3-VL-8B shape as the tuner reads it (no vLLM needed).

scripts/check_vl_model.py checks the same directory with transformers and vLLM on CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from tokenizers import Tokenizer

from tuner.config import DistConfig, ImageConfig, WorkloadConfig
from tuner.errors import ConfigError
from tuner.memory import (
    ARCH_OVERHEAD_GIB,
    GPU_PROFILES,
    GiB,
    ModelShape,
    estimate,
    kv_bytes_per_token,
)
from tuner.model_shape import vision_param_count
from tuner.workload import (
    build_requests,
    check_image_sizes,
    load_tokenizer,
    model_image_limit,
)
from tuner.workload.prompts import ChatTemplate

ROOT = Path(__file__).resolve().parents[2]
VL = ROOT / "models" / "qwen3-vl-8b-dummy"
TEXT_8B = ROOT / "models" / "qwen3-8b-dummy"
H200 = GPU_PROFILES["h200"]

VISION_TOKENS = {
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def read_json(name: str) -> Any:
    return json.loads((VL / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def shape() -> ModelShape:
    return ModelShape.from_dir(VL)


def test_directory_is_self_contained() -> None:
    """Every file is a regular file or a link that stays inside the repository."""
    names = {p.name for p in VL.iterdir()}
    assert {
        "config.json",
        "preprocessor_config.json",
        "video_preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    } <= names
    for p in VL.iterdir():
        assert p.resolve().is_relative_to(ROOT), p
        assert p.resolve().is_file(), p


def test_shape_reads_text_config(shape: ModelShape) -> None:
    assert shape.architecture == "Qwen3VLForConditionalGeneration"
    assert (shape.num_layers, shape.num_attention_heads, shape.num_kv_heads) == (36, 32, 8)
    assert (shape.head_dim, shape.hidden_size, shape.intermediate_size) == (128, 4096, 12288)
    assert shape.vocab_size == 151936
    assert shape.dtype_bytes == 2  # text_config.dtype bfloat16 (no top-level dtype)
    assert not shape.tie_word_embeddings
    assert shape.max_position_embeddings == 262144
    assert kv_bytes_per_token(shape, "auto", 1) == 147_456


def test_shape_parameters(shape: ModelShape) -> None:
    # transformers' Qwen3VLForConditionalGeneration on the meta device (scripts/check_vl_model.py):
    # 8,767,123,696 in all, 576,388,336 in the vision tower; the decoder is Qwen3-8B's.
    assert shape.vision_param_count == 576_388_336
    assert shape.param_count == ModelShape.from_dir(TEXT_8B).param_count == 8_190_735_360
    assert shape.weight_bytes == 8_767_123_696 * 2
    assert shape.weight_bytes / GiB == pytest.approx(16.33, abs=0.01)


def test_vision_param_count_formula() -> None:
    vcfg = read_json("config.json")["vision_config"]
    assert vision_param_count(vcfg) == 576_388_336
    # one block more adds 4d^2 + 2df + 9d + f; no deepstack mergers removes 3 of them
    d, f = 1152, 4304
    deeper = {**vcfg, "depth": 28}
    assert (
        vision_param_count(deeper) - vision_param_count(vcfg) == 4 * d * d + 2 * d * f + 9 * d + f
    )
    merged = 4 * d
    merger = 2 * merged + merged * merged + merged + merged * 4096 + 4096
    no_deepstack = {**vcfg, "deepstack_visual_indexes": []}
    assert vision_param_count(vcfg) - vision_param_count(no_deepstack) == 3 * merger


def test_nested_config_precedence() -> None:
    cfg = read_json("config.json")
    # a top-level dtype wins over text_config's (vLLM's get_torch_dtype order)
    shape = ModelShape.from_config({**cfg, "dtype": "float32"})
    assert shape.dtype_bytes == 4
    # top-level tie_word_embeddings wins; tied drops the lm_head (vocab x hidden)
    tied = ModelShape.from_config({**cfg, "tie_word_embeddings": True})
    assert ModelShape.from_config(cfg).param_count - tied.param_count == 151936 * 4096
    # text-only configs are read as before
    assert ModelShape.from_dir(TEXT_8B).vision_param_count == 0


def test_kv_prediction(shape: ModelShape) -> None:
    """Same decoder as Qwen3-8B: the KV cache is smaller by the vision weights (1.07 GiB) and the
    measured overhead of the multimodal model (``ARCH_OVERHEAD_GIB``)."""
    vl = estimate(shape, H200, {})
    text = estimate(ModelShape.from_dir(TEXT_8B), H200, {})
    assert vl.ok and text.ok
    assert vl.max_model_len == 262144
    assert vl.weights_gib - text.weights_gib == pytest.approx(576_388_336 * 2 / GiB)
    overhead = ARCH_OVERHEAD_GIB["Qwen3VLForConditionalGeneration"]
    assert vl.activation_gib == pytest.approx(text.activation_gib + overhead)
    lost = (text.kv_tokens - vl.kv_tokens) * vl.bytes_per_token
    assert lost == pytest.approx(576_388_336 * 2 + overhead * GiB, abs=16 * vl.bytes_per_token)
    # one 262,144-token request needs 36 GiB of KV cache
    low = estimate(shape, H200, {"gpu_memory_utilization": 0.3})
    assert not low.ok
    assert estimate(shape, H200, {"gpu_memory_utilization": 0.3, "max_model_len": 16384}).ok


def test_model_conf_matches_directory(shape: ModelShape) -> None:
    conf = yaml.safe_load((ROOT / "conf" / "model" / "qwen3-vl-8b.yaml").read_text())
    assert conf["path"].endswith("/models/qwen3-vl-8b-dummy")
    assert conf["max_model_len"] == shape.max_position_embeddings
    assert conf["load_format"] == "dummy"


def test_preprocessor_limit() -> None:
    pre = read_json("preprocessor_config.json")
    assert (pre["patch_size"], pre["merge_size"], pre["temporal_patch_size"]) == (16, 2, 2)
    assert pre["processor_class"] == "Qwen3VLProcessor"
    limit = model_image_limit(VL, default_max_pixels=123)
    # size.longest_edge is a pixel count (16,777,216 = 16384 tokens x 32 x 32), not an edge
    assert limit.max_pixels == 16_777_216
    assert limit.max_edge is None
    assert "size.longest_edge" in limit.source
    assert limit.violation(4096, 4096) is None
    assert limit.violation(4097, 4096) is not None


def test_image_heavy_sizes_fit(make_cfg: Any) -> None:
    cfg = make_cfg("+workload=image_heavy", "model=qwen3-vl-8b")
    assert cfg.model.path == str(VL)
    assert cfg.workload.images is not None
    check_image_sizes(cfg.workload.images, VL)
    with pytest.raises(ConfigError, match=r"sizes\[1\].*16777216"):
        check_image_sizes(ImageConfig(sizes=[[512, 512], [8192, 4096]]), VL)


def test_tokenizer_vision_tokens() -> None:
    tok = Tokenizer.from_file(str(VL / "tokenizer.json"))
    for text, tid in VISION_TOKENS.items():
        assert tok.token_to_id(text) == tid
    assert tok.encode(PLACEHOLDER, add_special_tokens=False).ids == [151652, 151655, 151653]
    # the tuner's own loader (the file here; transformers' backend where vLLM is installed)
    assert load_tokenizer(VL).token_to_id("<|image_pad|>") == 151655
    cfg = read_json("config.json")
    ids = (cfg["image_token_id"], cfg["video_token_id"])
    assert ids == (VISION_TOKENS["<|image_pad|>"], VISION_TOKENS["<|video_pad|>"])
    assert cfg["vision_start_token_id"] == VISION_TOKENS["<|vision_start|>"]
    assert cfg["vision_end_token_id"] == VISION_TOKENS["<|vision_end|>"]
    decoder = read_json("tokenizer_config.json")["added_tokens_decoder"]
    added = {a["id"]: a["content"] for a in json.loads(tok.to_str())["added_tokens"]}
    assert {int(k): v["content"] for k, v in decoder.items()} == added
    assert min(added) == 151643 and max(added) == 151668 and len(added) == 26


def test_the_text_models_share_the_vl_tokenizer_and_declare_its_added_tokens() -> None:
    """The text dummies' ``tokenizer.json`` is a link to this one (stored once: the tree's size
    limit), each with one link (a path through two links can fail a device call), and their
    ``tokenizer_config.json`` declares the same 26 added tokens as the file holds."""
    vl = json.loads((VL / "tokenizer.json").read_text(encoding="utf-8"))
    added = {str(a["id"]): a["content"] for a in vl["added_tokens"]}
    for name in ("qwen3-8b-dummy", "qwen-0.5b-dummy"):
        link = ROOT / "models" / name / "tokenizer.json"
        assert link.is_symlink() and os.readlink(link) == "../qwen3-vl-8b-dummy/tokenizer.json"
        decoder = json.loads((link.parent / "tokenizer_config.json").read_text())
        assert {k: v["content"] for k, v in decoder["added_tokens_decoder"].items()} == added
    sample = "<think>The quick brown fox</think>, 12 times: <|im_start|>!"
    ids = Tokenizer.from_file(str(TEXT_8B / "tokenizer.json")).encode(sample).ids
    assert ids[0] == 151667 and 151668 in ids and 151644 in ids  # one token each


def test_chat_template_renders_image_placeholders() -> None:
    pytest.importorskip("jinja2")
    source = read_json("tokenizer_config.json")["chat_template"]
    assert source == (VL / "chat_template.jinja").read_text(encoding="utf-8")
    template = ChatTemplate(VL)
    messages: Any = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare these."},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "image"},
            ],
        },
    ]
    assert template.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        f"<|im_start|>user\nCompare these.{PLACEHOLDER}{PLACEHOLDER}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # text-only messages (what the tuner renders to count tokens) are plain ChatML
    text_only = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert template.render(text_only) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_requests_for_the_vl_model() -> None:
    """build_requests counts the text with this model's tokenizer and template."""
    w = WorkloadConfig(
        name="t",
        corpus=str(ROOT / "workloads" / "corpus.txt.gz"),
        num_requests=4,
        warmup_requests=0,
        input_tokens=DistConfig(kind="uniform", low=20, high=60),
        output_tokens=DistConfig(kind="uniform", low=5, high=10),
        images=ImageConfig(min_count=1, max_count=2, sizes=[[64, 64]], formats=["png"]),
    )
    specs = build_requests(w, VL)
    tok = load_tokenizer(VL)
    for s in specs:
        (msg,) = s.body["messages"]
        text = msg["content"][0]["text"]
        chat = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
        n_text = len(tok.encode(chat, add_special_tokens=False).ids)
        # 64x64 is below the processor's min_pixels (65,536): resized to 256x256 -> 8x8 tokens,
        # and the template wraps each in <|vision_start|> ... <|vision_end|>
        assert s.prompt_tokens == n_text + s.images * (64 + 2)


def test_prompt_tokens_are_what_vllm_counts_for_image_heavy(make_cfg: Any) -> None:
    """The first 12 requests of image_heavy (its seed, Qwen3-VL-8B shape): ``usage.prompt_tokens``
    as vLLM 0.24.0 (CPU build, this model directory shrunk to 2 layers, transformers 5.17)
    answered them on 2026-11-30 — 1 to 4 images of 512x512 to 1280x720 each."""
    # that day's stream: independent draws (workload.stratify=false reproduces it)
    cfg = make_cfg("+workload=image_heavy", "model=qwen3-vl-8b", "workload.stratify=false")
    specs = build_requests(cfg.workload, Path(cfg.model.path))[:12]
    vllm = [2242, 2932, 1581, 3303, 3402, 1342, 857, 1608, 3565, 1675, 2989, 1213]
    assert [s.prompt_tokens for s in specs] == vllm
    assert [s.images for s in specs] == [3, 4, 2, 4, 4, 2, 1, 2, 4, 2, 4, 2]
