"""Cheap, seeded synthetic images as base64 data URLs (for multimodal chat workloads)."""

from __future__ import annotations

import base64
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tuner.config import ImageConfig, TunerConfig
from tuner.errors import ConfigError

__all__ = [
    "ImageGrid",
    "ImageLimit",
    "check",
    "check_image_sizes",
    "image_data_url",
    "image_tokens",
    "make_image",
    "model_image_grid",
    "model_image_limit",
]

PATCH = 28
_CELL = 8
"""Pixels per image-token side assumed by :func:`image_tokens` (Qwen-VL style 28x28 merges)."""


@dataclass(frozen=True)
class ImageGrid:
    """How a Qwen-VL processor turns an image into prompt tokens (``smart_resize`` of
    transformers' Qwen2-VL image processor, which Qwen2.5-VL and Qwen3-VL use too): the image is
    resized to multiples of ``factor`` = patch size x merge size within [``min_pixels``,
    ``max_pixels``], and each ``factor`` x ``factor`` tile is one token."""

    factor: int
    min_pixels: int
    max_pixels: int
    source: str

    def tokens(self, width: int, height: int) -> int:
        f = self.factor
        h_bar = round(height / f) * f
        w_bar = round(width / f) * f
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h_bar = max(f, math.floor(height / beta / f) * f)
            w_bar = max(f, math.floor(width / beta / f) * f)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / f) * f
            w_bar = math.ceil(width * beta / f) * f
        return (h_bar // f) * (w_bar // f)


def image_tokens(width: int, height: int, grid: ImageGrid | None = None) -> int:
    """Prompt tokens for one image: ``grid``'s rule (:func:`model_image_grid`), or, for a model
    directory without a Qwen-VL processor config, the estimate ceil(w/28) x ceil(h/28)."""
    if grid is not None:
        return grid.tokens(width, height)
    return math.ceil(width / PATCH) * math.ceil(height / PATCH)


def _processor_config(model_dir: Path | str) -> tuple[Path, dict[str, Any] | None]:
    """``<model_dir>/preprocessor_config.json`` as a mapping (None if the file is absent)."""
    path = Path(model_dir) / "preprocessor_config.json"
    if not path.is_file():
        return path, None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return path, cfg


def model_image_grid(model_dir: Path | str) -> ImageGrid | None:
    """The token grid ``<model_dir>/preprocessor_config.json`` states (``patch_size``,
    ``merge_size``; ``min_pixels``/``max_pixels`` or ``size.shortest_edge``/``longest_edge`` as
    pixel counts, as Qwen-VL processors store them), or None without one."""
    path, cfg = _processor_config(model_dir)
    if cfg is None or "patch_size" not in cfg:
        return None
    raw = cfg.get("size")
    size: dict[str, Any] = raw if isinstance(raw, dict) else {}
    factor = int(cfg["patch_size"]) * int(cfg.get("merge_size", 2))
    lo = _positive_int(cfg.get("min_pixels")) or _positive_int(size.get("shortest_edge"))
    hi = _positive_int(cfg.get("max_pixels")) or _positive_int(size.get("longest_edge"))
    return ImageGrid(factor, lo or 56 * 56, hi or 14 * 14 * 4 * 1280, str(path))


def make_image(width: int, height: int, rng: np.random.Generator) -> Image.Image:
    """An RGB image of a random colour gradient plus noise; every draw differs.

    Drawn on a grid 8x coarser than the image and upscaled (nearest) by Pillow, so generating
    and encoding stay cheap (a few ms for 1024x768) and PNG stays compressible.
    """
    if width < 1 or height < 1:
        raise ConfigError(f"image size {width}x{height}; need positive width and height")
    h, w = max(1, -(-height // _CELL)), max(1, -(-width // _CELL))
    y = np.linspace(0.0, 1.0, h, dtype=np.float32)[:, None, None]
    x = np.linspace(0.0, 1.0, w, dtype=np.float32)[None, :, None]
    base = rng.uniform(0, 255, size=3).astype(np.float32)
    gx = rng.uniform(-160, 160, size=3).astype(np.float32)
    gy = rng.uniform(-160, 160, size=3).astype(np.float32)
    noise = rng.normal(0.0, 24.0, size=(h, w, 3)).astype(np.float32)
    small = np.clip(base + gx * x + gy * y + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(small, "RGB").resize((width, height), Image.Resampling.NEAREST)


def image_data_url(width: int, height: int, fmt: str, rng: np.random.Generator) -> str:
    """``data:image/{jpeg,png};base64,...`` of a fresh :func:`make_image`."""
    fmt = fmt.lower()
    if fmt in ("jpg", "jpeg"):
        fmt, kwargs = "jpeg", {"quality": 85}
    elif fmt == "png":
        kwargs = {"compress_level": 1}
    else:
        raise ConfigError(f"image format is {fmt!r}; allowed: jpeg, png")
    buf = io.BytesIO()
    make_image(width, height, rng).save(buf, format=fmt.upper(), **kwargs)
    return f"data:image/{fmt};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


_PIXEL_COUNT_EDGE = 65_536
"""A ``size.longest_edge`` above this is a pixel count (Qwen2-VL's processors store
``max_pixels`` there), not an edge length: no encoder accepts a 65,536-pixel-long edge."""


class ImageLimit:
    """The largest image a model takes: at most ``max_pixels`` pixels and, if set, at most
    ``max_edge`` pixels on the longer side. ``source`` says where the limit comes from."""

    def __init__(self, max_pixels: int | None, max_edge: int | None, source: str) -> None:
        self.max_pixels = max_pixels
        self.max_edge = max_edge
        self.source = source

    def violation(self, width: int, height: int) -> str | None:
        """Why ``width`` x ``height`` is too large, or ``None``."""
        if self.max_pixels is not None and width * height > self.max_pixels:
            return f"{width * height} pixels; the model accepts at most {self.max_pixels}"
        if self.max_edge is not None and max(width, height) > self.max_edge:
            return f"longest edge {max(width, height)}; the model accepts at most {self.max_edge}"
        return None


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return int(value)


def model_image_limit(model_dir: Path | str, default_max_pixels: int) -> ImageLimit:
    """The image limit from ``<model_dir>/preprocessor_config.json`` if it states one.

    Read keys: ``max_pixels`` (a pixel count), ``size.longest_edge`` and
    ``max_image_size.longest_edge`` (an edge length in pixels, or a pixel count when larger
    than 65,536, as Qwen2-VL's processors store ``max_pixels``). Without the file, or without
    any of those keys, the limit is ``default_max_pixels`` (``workload.images.max_pixels``).
    """
    path, cfg = _processor_config(model_dir)
    fallback = ImageLimit(default_max_pixels, None, "workload.images.max_pixels")
    if cfg is None:
        return fallback
    max_pixels = _positive_int(cfg.get("max_pixels"))
    max_edge: int | None = None
    keys: list[str] = ["max_pixels"] if max_pixels is not None else []
    for outer in ("size", "max_image_size"):
        sub = cfg.get(outer)
        edge = _positive_int(sub.get("longest_edge")) if isinstance(sub, dict) else None
        if edge is None:
            continue
        keys.append(f"{outer}.longest_edge")
        if edge > _PIXEL_COUNT_EDGE:
            max_pixels = edge if max_pixels is None else min(max_pixels, edge)
        else:
            max_edge = edge if max_edge is None else min(max_edge, edge)
    if not keys:
        return fallback
    return ImageLimit(max_pixels, max_edge, f"{' and '.join(keys)} in {path}")


def check(cfg: TunerConfig) -> None:
    """``workload.images``: every size bucket within what the model (``model.path``) accepts
    (:func:`check_image_sizes`)."""
    if cfg.workload.images is not None:
        check_image_sizes(cfg.workload.images, cfg.model.files)


def check_image_sizes(im: ImageConfig, model_dir: Path | str) -> None:
    """Raise :class:`ConfigError` naming ``workload.images.sizes[i]`` if a bucket is larger than
    the model accepts (:func:`model_image_limit`)."""
    if im.max_pixels < 1:
        raise ConfigError(f"workload.images.max_pixels is {im.max_pixels}; allowed: >= 1")
    limit = model_image_limit(model_dir, im.max_pixels)
    for i, size in enumerate(im.sizes):
        width, height = (int(v) for v in size)
        why = limit.violation(width, height)
        if why is not None:
            raise ConfigError(
                f"workload.images.sizes[{i}] is {width}x{height} ({why}, from {limit.source})"
            )
