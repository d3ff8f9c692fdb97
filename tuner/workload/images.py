"""Cheap, seeded synthetic images as base64 data URLs (for multimodal chat workloads)."""

from __future__ import annotations

import base64
import io
import math

import numpy as np
from PIL import Image

from tuner.errors import ConfigError

__all__ = ["image_data_url", "image_tokens", "make_image"]

PATCH = 28
_CELL = 8
"""Pixels per image-token side assumed by :func:`image_tokens` (Qwen-VL style 28x28 merges)."""


def image_tokens(width: int, height: int) -> int:
    """Estimated prompt tokens for one image: ceil(w/28) x ceil(h/28)."""
    return math.ceil(width / PATCH) * math.ceil(height / PATCH)


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
