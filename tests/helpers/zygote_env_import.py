"""Preloaded by engine.preload's tests: changes the environment when imported, as vLLM's
``env_override`` does (``TORCHINDUCTOR_COMPILE_THREADS=1`` and others)."""

from __future__ import annotations

import os

os.environ["ZYGOTE_SET_AT_IMPORT"] = "1"
os.environ.setdefault("ZYGOTE_GPU", "set at import")
os.environ.pop("ZYGOTE_DROPPED_AT_IMPORT", None)
