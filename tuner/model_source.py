"""Where the model's files come from, and what the tuner derives from them.

``model.path`` is a local directory (used as it is) or a Hugging Face repo id (``Qwen/Qwen3-8B``):
an id is resolved through the Hugging Face cache with ``huggingface_hub.snapshot_download``,
config, tokenizer, chat template and processor files only (:data:`HUB_FILES`); vLLM fetches the
weights itself, from the same cache. ``huggingface_hub`` honours ``HF_HOME`` / ``HF_HUB_CACHE``,
``HF_HUB_OFFLINE`` (the cache only, no request) and ``HF_TOKEN`` (gated repos; the tuner masks it
as one of ``engine.pass_env``). :func:`resolve` fills in what the model's YAML leaves null: the
local directory, the name and ``max_model_len`` (:func:`context_length`, vLLM's derivation).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.config import ModelConfig
from tuner.errors import ConfigError
from tuner.model_gguf import build_hint

__all__ = ["HUB_FILES", "context_length", "derived_name", "local_files", "resolve"]

HUB_FILES = [
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab*",
    "merges.txt",
    "*.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "processor_config.json",
]
"""The files of a repo id the tuner reads (``snapshot_download``'s ``allow_patterns``)."""

_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
"""The keys vLLM 0.24 reads a model's context length from (``_get_and_verify_max_len``)."""


def _repo_id(path: str) -> bool:
    """``path`` has the form of a Hugging Face repo id (``name`` or ``org/name``)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(path)
    except HFValidationError:
        return False
    return True


def local_files(path: str) -> Path:
    """The local directory with the model's ``config.json`` and tokenizer files: ``path`` itself
    when it is a directory, else the snapshot of repo id ``path`` in the Hugging Face cache
    (fetched into it when missing, unless ``HF_HUB_OFFLINE``).

    Raises :class:`ConfigError` (one line) for a path that is neither (saying how to build it
    when it is :mod:`tuner.model_gguf`'s folder), a repo that cannot be found or reached, or one
    that is not in the cache while offline.
    """
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    hint = build_hint(local)
    if hint is not None:  # a folder tuner.model_gguf builds (model=smollm2-135m), not built yet
        raise ConfigError(f"model.path {path!r} does not exist: {hint}")
    if not _repo_id(path):
        raise ConfigError(
            f"model.path {path!r} is not a directory, nor a Hugging Face repo id (org/name)"
        )
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        return Path(snapshot_download(path, allow_patterns=HUB_FILES))
    except GatedRepoError as exc:
        raise ConfigError(
            f"model.path {path!r} is a gated Hugging Face repo: accept its terms on the Hub and "
            "set HF_TOKEN"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ConfigError(
            f"model.path {path!r} is not a directory, nor a Hugging Face repo this token can "
            "see (a private repo needs HF_TOKEN)"
        ) from exc
    except LocalEntryNotFoundError as exc:
        where = f"the Hugging Face cache {constants.HF_HUB_CACHE}"
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub cannot be reached"
        raise ConfigError(
            f"model.path {path!r} is not a directory, and the repo is not in {where} ({why})"
        ) from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"model.path {path!r}: the Hugging Face Hub said: {first}") from exc


def derived_name(path: str) -> str:
    """The model's name from its path: the last component (a repo id's name), lower-cased."""
    return Path(path.rstrip("/")).name.lower() or "model"


def context_length(config: Mapping[str, Any]) -> int | None:
    """vLLM 0.24's derived ``max_model_len`` from a ``config.json`` mapping (``text_config``'s for
    a vision-language model): the smallest of the length keys it has, times the RoPE scaling
    factor (from ``original_max_position_embeddings`` for ``yarn``; not for ``su``, ``longrope``,
    ``llama3``, which state the scaled length). None when no key is there."""
    text = config.get("text_config")
    cfg: Mapping[str, Any] = {**config, **text} if isinstance(text, Mapping) else config
    lengths = [int(cfg[k]) for k in _LENGTH_KEYS if isinstance(cfg.get(k), int | float)]
    if not lengths:
        return None
    length = float(min(lengths))
    rope = cfg.get("rope_scaling")
    if isinstance(rope, Mapping) and "gemma3" not in str(cfg.get("model_type", "")):
        kind = rope.get("rope_type") or rope.get("type")
        if kind not in ("su", "longrope", "llama3"):
            if kind == "yarn" and rope.get("original_max_position_embeddings"):
                length = float(rope["original_max_position_embeddings"])
            length *= float(rope.get("factor") or 1.0)
    return int(length)


def resolve(model: ModelConfig) -> ModelConfig:
    """``model`` with what its YAML leaves null filled in: ``local_dir`` (:func:`local_files`),
    ``name`` (:func:`derived_name`) and ``max_model_len`` (:func:`context_length`)."""
    files = local_files(model.path)
    name = model.name or derived_name(model.path)
    max_model_len = model.max_model_len
    if max_model_len is None:
        config_path = files / "config.json"
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"model.path {model.path!r} has no config.json") from exc
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {config_path}: {exc}") from exc
        max_model_len = context_length(config) if isinstance(config, dict) else None
        if max_model_len is None:
            raise ConfigError(
                f"{config_path} states no context length (max_position_embeddings); "
                "set model.max_model_len"
            )
    return dataclasses.replace(model, local_dir=str(files), name=name, max_model_len=max_model_len)
