"""The architecture numbers vLLM's memory and speed depend on, read from a model's ``config.json``
as vLLM reads it (:class:`ModelShape`), and the parameters of a Qwen3-VL vision tower
(:func:`vision_param_count`). :mod:`tuner.memory` turns a shape into KV-cache tokens; the
simulator (:mod:`tuner.sim`) into step times too.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["DTYPE_BYTES", "ModelShape", "vision_param_count"]

DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "bf16": 2,
    "fp16": 2,
    "float32": 4,
    "float": 4,
    "fp32": 4,
}
"""Bytes per element of a ``torch_dtype`` / ``kv_cache_dtype`` name."""


def vision_param_count(vcfg: Mapping[str, Any]) -> int:
    """Parameters of a Qwen3-VL vision tower from its ``vision_config`` (weights + biases).

    With ``d`` = ``hidden_size``, ``f`` = ``intermediate_size``, ``m2`` = ``spatial_merge_size``²,
    ``D`` = ``d x m2`` (a merged 2x2 patch), ``o`` = ``out_hidden_size``::

        patch_embed  d x in_channels x temporal_patch_size x patch_size² + d    (Conv3d + bias)
        pos_embed    num_position_embeddings x d
        per block    4d (2 LayerNorms) + 3d² + 3d (qkv) + d² + d (proj)
                     + d x f + f + f x d + d (MLP)                   = 4d² + 2df + 9d + f
        merger       2d (LayerNorm over d) + D² + D + D x o + o
        deepstack    per index: 2D (LayerNorm over D) + D² + D + D x o + o

    This is the layout of transformers' ``Qwen3VLVisionModel`` and vLLM's
    ``Qwen3_VisionTransformer``; for Qwen3-VL-8B it gives 576,388,336, exactly what transformers
    counts on the meta device (scripts/check_vl_model.py). Missing keys take Qwen3-VL's defaults.
    """
    d = int(vcfg.get("hidden_size", 1152))
    f = int(vcfg.get("intermediate_size", 4304))
    depth = int(vcfg.get("depth", 27))
    patch = int(vcfg.get("patch_size", 16))
    temporal = int(vcfg.get("temporal_patch_size", 2))
    channels = int(vcfg.get("in_channels", 3))
    merge = int(vcfg.get("spatial_merge_size", 2))
    out = int(vcfg.get("out_hidden_size", 3584))
    positions = int(vcfg.get("num_position_embeddings", 2304))
    deepstack = len(vcfg.get("deepstack_visual_indexes") or ())
    merged = d * merge * merge
    patch_embed = d * channels * temporal * patch * patch + d
    block = 4 * d * d + 2 * d * f + 9 * d + f
    merger_mlp = merged * merged + merged + merged * out + out
    return (
        patch_embed
        + positions * d
        + depth * block
        + (2 * d + merger_mlp)
        + deepstack * (2 * merged + merger_mlp)
    )


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The architecture numbers that memory and speed depend on (dense decoder-only models, and
    vision-language models whose decoder is one: the KV cache and speed come from the decoder,
    the weights from both)."""

    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    param_count: int
    model_max_length: int | None = None
    architecture: str = ""
    """``architectures[0]`` of ``config.json`` (vLLM picks its model runner by it)."""
    vision_param_count: int = 0
    """Parameters of the vision tower (0 for a text-only model). Not in :attr:`param_count` (the
    decoder's, which sets the per-token compute); in :attr:`weight_bytes` (vLLM loads both)."""

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> ModelShape:
        """The shape from a ``config.json`` mapping.

        A vision-language config (Qwen3-VL: ``text_config`` + ``vision_config``) is read as vLLM
        reads it: the decoder's numbers from ``text_config`` (top-level keys fill what it lacks),
        ``architectures`` and ``tie_word_embeddings`` from the top level, the dtype from the top
        level else ``text_config`` (vLLM's ``get_torch_dtype``), and the vision tower's
        parameters (:func:`vision_param_count`) as :attr:`vision_param_count`.
        """
        text_cfg = cfg.get("text_config")
        vision_cfg = cfg.get("vision_config")
        top_dtype = cfg.get("torch_dtype") or cfg.get("dtype")
        if isinstance(text_cfg, Mapping):
            merged = {**cfg, **text_cfg}
            if "tie_word_embeddings" in cfg:
                merged["tie_word_embeddings"] = cfg["tie_word_embeddings"]
            merged["architectures"] = cfg.get("architectures")
            cfg = merged
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        layers = int(cfg["num_hidden_layers"])
        inter = int(cfg["intermediate_size"])
        vocab = int(cfg["vocab_size"])
        tied = bool(cfg.get("tie_word_embeddings", False))
        dtype = str(top_dtype or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower()
        dtype = dtype.removeprefix("torch.")
        q = heads * head_dim
        kv = kv_heads * head_dim
        attn = hidden * q + 2 * hidden * kv + q * hidden
        if cfg.get("attention_bias") or cfg.get("model_type") == "qwen2":
            attn += q + 2 * kv  # Qwen2 has q/k/v biases
        if cfg.get("model_type") in ("qwen3", "qwen3_vl_text"):
            attn += 2 * head_dim  # q_norm / k_norm
        mlp = 3 * hidden * inter
        per_layer = attn + mlp + 2 * hidden
        params = vocab * hidden + layers * per_layer + hidden
        if not tied:
            params += vocab * hidden
        vision = vision_param_count(vision_cfg) if isinstance(vision_cfg, Mapping) else 0
        mml = cfg.get("model_max_length")
        return cls(
            num_layers=layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            hidden_size=hidden,
            intermediate_size=inter,
            vocab_size=vocab,
            dtype_bytes=DTYPE_BYTES.get(dtype, 2),
            tie_word_embeddings=tied,
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 2048),
            param_count=params,
            model_max_length=int(mml) if mml is not None else None,
            architecture=str((cfg.get("architectures") or [""])[0]),
            vision_param_count=vision,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelShape:
        """Read ``config.json`` from a model directory."""
        with open(Path(path) / "config.json", encoding="utf-8") as fh:
            return cls.from_config(json.load(fh))

    @property
    def weight_bytes(self) -> int:
        """All weights vLLM loads: the decoder and, in a vision-language model, the vision tower."""
        return (self.param_count + self.vision_param_count) * self.dtype_bytes
