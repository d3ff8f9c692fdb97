from __future__ import annotations

import pytest

from tuner.engine.logparse import classify, is_fatal, parse_facts, port_clash, strip_prefix
from tuner.errors import FailureReason

LOG = """\
INFO 11-30 02:13:05 [api_server.py:1] vLLM server version 0.24.0, serving model /m
(EngineCore pid=77) INFO 11-30 02:13:09 [gpu_model_runner.py:5255] Model loading took 15.27 GiB memory and 4.512345 seconds
(EngineCore pid=77) INFO 11-30 02:13:30 [gpu_worker.py:508] Available KV cache memory: 111.83 GiB
(EngineCore pid=77) INFO 11-30 02:13:30 [kv_cache_utils.py:2137] GPU KV cache size: 814,368 tokens
(EngineCore pid=77) INFO 11-30 02:13:30 [kv_cache_utils.py:2147] Maximum concurrency for 40,960 tokens per request: 19.88x
(EngineCore pid=77) INFO 11-30 02:13:50 [gpu_model_runner.py:6656] Graph capturing finished in 12 secs, took 0.55 GiB
(EngineCore pid=77) INFO 11-30 02:13:51 [core.py:326] init engine (profile, create kv cache, warmup model) took 41.20 s (compilation: 22.10 s)
"""


def test_parse_facts() -> None:
    f = parse_facts(LOG.splitlines())
    assert f.kv_cache_tokens == 814_368
    assert f.max_concurrency == pytest.approx(19.88)
    assert f.max_model_len == 40960
    assert f.kv_cache_gib == pytest.approx(111.83)
    assert (f.model_load_gib, f.model_load_s) == (pytest.approx(15.27), pytest.approx(4.512345))
    assert (f.graph_capture_s, f.graph_capture_gib) == (12.0, pytest.approx(0.55))
    assert (f.init_engine_s, f.compile_s) == (pytest.approx(41.2), pytest.approx(22.1))
    assert f.engine_version == "0.24.0"


def test_model_load_line_as_vllm_0_24_prints_it() -> None:
    # seen on the H200 (vLLM 0.24.0): no "memory" word
    line = "(EngineCore pid=1429) INFO 11-30 02:28:11 [model_runner.py:302] Model loading took 15.27 GiB and 2.150722 seconds"
    f = parse_facts([line])
    assert (f.model_load_gib, f.model_load_s) == (pytest.approx(15.27), pytest.approx(2.150722))


def test_strip_prefix() -> None:
    line = "(EngineCore_DP0 pid=5) ERROR 11-30 02:13:05 [core.py:1] EngineCore failed to start."
    assert strip_prefix(line) == "EngineCore failed to start."


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "ValueError: Free memory on device cuda:0 (10.0/140.4 GiB) on startup is less than "
            "desired GPU memory utilization (0.92, 129.2 GiB). Decrease GPU memory utilization",
            FailureReason.GPU_BUSY,
        ),
        (
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine",
            FailureReason.NO_KV_MEMORY,
        ),
        (
            "ValueError: To serve at least one request with the model's max seq len (40960), "
            "(5.62 GiB KV cache is needed, which is larger than the available KV cache memory "
            "(1.20 GiB).",
            FailureReason.KV_TOO_SMALL,
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            FailureReason.CUDA_OOM,
        ),
        (
            "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy "
            "requests.",
            FailureReason.CUDA_OOM,
        ),
        ("vllm serve: error: unrecognized arguments: --swap-space 4", FailureReason.INVALID_CONFIG),
        (
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig",
            FailureReason.INVALID_CONFIG,
        ),
        (
            "ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(",
            FailureReason.INVALID_CONFIG,
        ),
        ("ERROR [core.py:1232] EngineCore encountered a fatal error.", FailureReason.ENGINE_DEAD),
        (
            "TimeoutError: Timed out waiting for engine core processes to start.",
            FailureReason.STARTUP_TIMEOUT,
        ),
    ],
)
def test_classify(text: str, reason: FailureReason) -> None:
    lines = [
        "INFO 11-30 02:13:05 [x.py:1] starting",
        text,
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    got, detail = classify(lines)
    assert got is reason
    assert detail.split(":")[0] in text
    assert is_fatal(text) or reason is FailureReason.ENGINE_DEAD


def test_root_cause_beats_wrapper_and_unknown_is_crash() -> None:
    lines = [
        "RuntimeError: Engine core initialization failed. See root cause above.",
        "ValueError: No available memory for the cache blocks.",
    ]
    assert classify(lines)[0] is FailureReason.NO_KV_MEMORY
    reason, detail = classify(["something", "Segfault Error in libfoo", "bye"])
    assert reason is FailureReason.CRASH and "Segfault" in detail
    assert classify([], after_ready=True)[0] is FailureReason.ENGINE_DEAD


def test_validation_error_detail_includes_field() -> None:
    lines = [
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig",
        "gpu_memory_utilization",
        "  Input should be less than or equal to 1 [type=less_than_equal, input_value=1.5]",
    ]
    reason, detail = classify(lines)
    assert reason is FailureReason.INVALID_CONFIG
    assert "gpu_memory_utilization" in detail and "less than or equal to 1" in detail


@pytest.mark.parametrize(
    ("lines", "clash"),
    [
        (["OSError: [Errno 98] Address already in use"], True),  # vLLM's HTTP socket
        (
            [
                "(EngineCore pid=7) ERROR 11-30 14:02:11 [core.py:1] torch.distributed."
                "DistNetworkError: The server socket has failed to listen on any local network "
                "address. port: 41234, useIPv6: false, code: -98, name: EADDRINUSE, message: "
                "address already in use"
            ],
            True,
        ),  # torch's TCPStore on the distributed init port
        (["torch.OutOfMemoryError: CUDA out of memory."], False),
        ([], False),
    ],
)
def test_port_clash(lines: list[str], clash: bool) -> None:
    assert port_clash(lines) is clash
