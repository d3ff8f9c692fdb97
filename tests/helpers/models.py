"""The Qwen3-8B shape the precheck tests predict for, and vLLM 0.24's defaults as the precheck
sees them resolved (``tests/unit/test_precheck.py``, ``tests/unit/test_new_user_defects.py``)."""

from __future__ import annotations

from pathlib import Path

from tuner.memory import ModelShape

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ModelShape.from_dir(ROOT / "models" / "qwen3-8b-dummy")  # 32 attention heads
DEFAULTS = {
    "gpu_memory_utilization": 0.92,
    "max_model_len": 40960,
    "block_size": 16,
    "max_num_seqs": 1024,
    "max_num_batched_tokens": 8192,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "enforce_eager": False,
    "cudagraph_mode": "FULL_AND_PIECEWISE",
    "kv_cache_dtype": "auto",
}
