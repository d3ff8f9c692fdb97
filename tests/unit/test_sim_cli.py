"""The simulator's vLLM-compatible CLI, its start-up refusals, and the scheduler/speed model."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.memory import GPU_PROFILES, ModelShape, estimate, resolve_params, weight_bytes
from tuner.sim.cli import human_readable_int, parse_args
from tuner.sim.engine import (
    FP8_GEMM_SPEEDUP,
    WEIGHT_STREAM_S,
    Request,
    Scheduler,
    SpeedModel,
    graph_kind,
    simulate_closed_loop,
)

ROOT = Path(__file__).resolve().parents[2]
QWEN8B = str(ROOT / "models" / "qwen3-8b-dummy")
QWEN05B = str(ROOT / "models" / "qwen-0.5b-dummy")


def run_sim(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "TUNER_SIM_SPEEDUP": "1000", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "tuner.sim", "serve", *args, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env=full_env,
    )


@pytest.mark.parametrize(
    "flags",
    [["--swap-space", "4"], ["--enable-cuda-graphs"], ["--disable-log-requests"]],
)
def test_unknown_flag_exits_2(flags: list[str]) -> None:
    proc = run_sim(QWEN05B, *flags)
    assert proc.returncode == 2
    assert "error: unrecognized arguments: " + " ".join(flags) in proc.stderr


def test_dashes_and_underscores() -> None:
    a = parse_args(["serve", "m", "--max_num_seqs", "64", "--gpu-memory_utilization=0.5"])
    assert a.max_num_seqs == 64 and a.gpu_memory_utilization == 0.5
    assert {"max_num_seqs", "gpu_memory_utilization"} <= a.user_set


def test_dotted_compilation_config() -> None:
    a = parse_args(
        ["serve", "m", "-cc.cudagraph_mode=PIECEWISE", "-cc.max_cudagraph_capture_size", "64"]
    )
    assert a.compilation_config == {"cudagraph_mode": "PIECEWISE", "max_cudagraph_capture_size": 64}
    b = parse_args(["serve", "m", "--compilation-config", '{"cudagraph_mode": "NONE"}'])
    assert b.compilation_config == {"cudagraph_mode": "NONE"}
    c = parse_args(["serve", "m", "--limit-mm-per-prompt.image", "2"])
    assert c.limit_mm_per_prompt == {"image": 2}


def test_bool_flags_and_opt_level() -> None:
    a = parse_args(["serve", "m", "--no-enable-prefix-caching", "--enforce-eager", "-O0"])
    assert a.enable_prefix_caching is False and a.enforce_eager is True
    assert a.optimization_level == 0
    assert parse_args(["serve", "m", "-O", "3"]).optimization_level == 3
    assert parse_args(["serve", "m"]).enable_prefix_caching is None


def test_human_readable_ints() -> None:
    assert human_readable_int("8k") == 8000
    assert human_readable_int("8K") == 8192
    assert human_readable_int("25.6k") == 25600
    assert human_readable_int("2G") == 2 * 1024**3
    assert human_readable_int("123") == 123
    with pytest.raises(argparse.ArgumentTypeError):
        human_readable_int("1.5K")
    assert parse_args(["serve", "m", "--max-num-batched-tokens", "16K"]).max_num_batched_tokens == (
        16384
    )
    assert parse_args(["serve", "m", "--max-model-len", "auto"]).max_model_len == -1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--gpu-memory-utilization", "1.5"],
            "gpu_memory_utilization\n  Input should be less than or equal to 1 "
            "[type=less_than_equal, input_value=1.5, input_type=float]",
        ),
        (
            ["--gpu-memory-utilization", "0"],
            "Input should be greater than 0 [type=greater_than, input_value=0.0",
        ),
        (["--block-size", "0"], "1 validation error for CacheConfig\nblock_size"),
        (["--max-num-seqs", "0"], "1 validation error for SchedulerConfig\nmax_num_seqs"),
        (
            ["--max-model-len", "50000"],
            "ValueError: User-specified max_model_len (50000) is greater than the derived "
            "max_model_len (max_position_embeddings=40960 or model_max_length=None in model's "
            "config.json).",
        ),
        (
            ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096"],
            "ValueError: max_num_batched_tokens (4096) is smaller than max_model_len (40960). "
            "This effectively limits the maximum sequence length to max_num_batched_tokens and "
            "makes vLLM reject longer sequences. Please increase max_num_batched_tokens or "
            "decrease max_model_len.",
        ),
        (
            ["--max-num-seqs", "512", "--max-num-batched-tokens", "256"],
            "ValueError: max_num_batched_tokens (256) must be greater than or equal to "
            "max_num_seqs (512).",
        ),
        (
            ["-tp", "2"],
            "ValueError: World size (2) is larger than the number of available GPUs (1) in this "
            "node.",
        ),
        (
            ["--max-num-partial-prefills", "2"],
            "NotImplementedError: Concurrent Partial Prefill is not supported. We recommend to "
            "remove Concurrent Partial Prefill from your config.",
        ),
    ],
)
def test_config_refusals_exit_1(flags: list[str], message: str) -> None:
    proc = run_sim(QWEN8B, *flags, env={"CUDA_VISIBLE_DEVICES": "0"})
    assert proc.returncode == 1
    text = "\n".join(
        line.split(") ", 1)[1] if line.startswith("(APIServer") else line
        for line in proc.stderr.splitlines()
    )
    assert "Traceback (most recent call last):" in text
    assert message in text
    assert "EngineCore" not in proc.stdout  # refused before any engine process


def test_tp_must_divide_heads() -> None:
    proc = run_sim(QWEN8B, "-tp", "3", env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert proc.returncode == 1
    assert (
        "ValueError: Total number of attention heads (32) must be divisible by tensor parallel "
        "size (3)." in proc.stderr
    )


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (["--gpu-memory-utilization", "0.12"], {}, "No available memory for the cache blocks."),
        (
            ["--gpu-memory-utilization", "0.13"],
            {},
            "To serve at least one request with the model's max seq len (40960), (5.62 GiB",
        ),
        (["--block-size", "24"], {}, "No valid attention backend found for cuda with"),
        (
            [],
            {"TUNER_SIM_USED_GIB": "20"},
            "ValueError: Free memory on device cuda:0 (120.4/140.4 GiB) on startup is less than "
            "desired GPU memory utilization (0.92, 129.17 GiB).",
        ),
    ],
)
def test_engine_core_refusals(flags: list[str], env: dict[str, str], message: str) -> None:
    proc = run_sim(QWEN8B, *flags, env=env)
    assert proc.returncode == 1
    assert "EngineCore failed to start." in proc.stdout
    assert message in proc.stdout
    assert (
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
        "proc(s): {'EngineCore': 1}" in proc.stderr
    )
    assert "Application startup complete." not in proc.stdout


@pytest.mark.parametrize(
    ("mode", "prefill", "decode", "kind"),
    [
        ("FULL_AND_PIECEWISE", 0, 64, "full"),
        ("FULL_AND_PIECEWISE", 300, 63, "piecewise"),
        ("FULL_AND_PIECEWISE", 450, 63, "ungraphed"),  # 512 tokens fit, 513 do not
        ("FULL_AND_PIECEWISE", 0, 600, "ungraphed"),  # over the largest capture size
        ("PIECEWISE", 0, 64, "piecewise"),
        ("PIECEWISE", 500, 64, "ungraphed"),
        ("FULL_DECODE_ONLY", 0, 64, "full"),
        # the compiled model without graphs, not eager (vLLM 0.24 keeps torch.compile)
        ("FULL_DECODE_ONLY", 300, 63, "ungraphed"),
        ("FULL", 300, 63, "ungraphed"),
        ("NONE", 0, 64, "eager"),
    ],
)
def test_graph_kind_follows_the_cudagraph_mode(
    mode: str, prefill: int, decode: int, kind: str
) -> None:
    assert graph_kind(mode, 512, prefill, decode) == kind
    speed = SpeedModel()
    assert max(speed.overhead_graph_s, speed.overhead_piecewise_s) < speed.overhead_eager_s


def _scheduler(params: dict, num_blocks: int | None = None, caching: bool = True) -> Scheduler:
    shape = ModelShape.from_dir(QWEN8B)
    gpu = GPU_PROFILES["h200"]
    r = resolve_params(shape, gpu, params)
    est = estimate(shape, gpu, params)
    return Scheduler(
        num_blocks=num_blocks or est.kv_tokens // r.block_size,
        block_size=r.block_size,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        chunked_prefill=r.enable_chunked_prefill,
        prefix_caching=caching,
        speed=SpeedModel.for_model(
            shape, r.tensor_parallel_size, r.kv_dtype_bytes, quantization=r.quantization
        ),
        max_graph_batch=max(r.capture_sizes, default=0) if r.cudagraph_mode != "NONE" else 0,
        cudagraph_mode=r.cudagraph_mode,
    )


@pytest.mark.parametrize(
    ("params", "tok_s", "tpot_ms", "ttft_ms", "rel"),
    [
        pytest.param({}, 9136, 22.2, 1262, 0.25, id="defaults"),
        pytest.param({"enforce_eager": True}, 7516, 30.4, None, 0.08, id="enforce-eager"),
    ],
)
def test_speed_calibration(
    params: dict, tok_s: float, tpot_ms: float, ttft_ms: float | None, rel: float
) -> None:
    """Real H200 numbers: Qwen3-8B, 1000 prompts 512 in / 256 out, 256 concurrent. The bounds
    are what the speed model fitted on all calibration points achieves here (defaults: +8 %
    tok/s, -8 % TPOT; docs/sim-calibration.md); tests/unit/test_sim_calibration.py has the rest."""
    res = simulate_closed_loop(
        _scheduler(params), num_requests=1000, concurrency=256, prompt_len=512, output_len=256
    )
    assert res.output_tok_s == pytest.approx(tok_s, rel=rel)
    assert res.tpot_p50_s * 1000 == pytest.approx(tpot_ms, rel=rel)
    if ttft_ms is not None:
        assert res.ttft_p50_s * 1000 == pytest.approx(ttft_ms, rel=0.3)


def test_eager_is_slower_than_cuda_graphs() -> None:
    kw = {"num_requests": 300, "concurrency": 64, "prompt_len": 512, "output_len": 128}
    graphs = simulate_closed_loop(_scheduler({}), **kw)
    eager = simulate_closed_loop(_scheduler({"enforce_eager": True}), **kw)
    assert eager.output_tok_s < graphs.output_tok_s
    assert eager.tpot_p50_s > graphs.tpot_p50_s


def test_fp8_weights_stream_fewer_bytes_and_run_faster_gemms() -> None:
    shape = ModelShape.from_dir(QWEN8B)
    bf16 = SpeedModel.for_model(shape)
    fp8 = SpeedModel.for_model(shape, quantization="fp8")
    # the decoder's linear weights at 1 byte: 6.95e9 of Qwen3-8B's 16.4e9 bytes fewer a step
    saved = WEIGHT_STREAM_S * (1 - weight_bytes(shape, "fp8") / shape.weight_bytes)
    assert bf16.overhead_graph_s - fp8.overhead_graph_s == pytest.approx(saved, rel=1e-3)
    assert 0.0010 < saved < 0.0015
    assert fp8.per_token_s == pytest.approx(bf16.per_token_s / FP8_GEMM_SPEEDUP)
    assert fp8.per_ctx_token_s == bf16.per_ctx_token_s  # the KV cache stays 16-bit
    assert SpeedModel.for_model(shape, quantization=None) == bf16


def test_fp8_weights_speed_up_a_closed_loop_as_on_the_h200() -> None:
    """On the H200 (chat at 256 in flight, 3 + 3 servers) fp8 weights' TPOT p50 was 0.786 of the
    defaults' and their output tok/s 1.15-1.20 times (benchmarks/sim_fp8_weights.py)."""
    kw = {"num_requests": 600, "concurrency": 256, "prompt_len": 512, "output_len": 128}
    bf16 = simulate_closed_loop(_scheduler({}), **kw)
    fp8 = simulate_closed_loop(_scheduler({"quantization": "fp8"}), **kw)
    assert 0.70 < fp8.tpot_p50_s / bf16.tpot_p50_s < 0.87
    assert 1.10 < fp8.output_tok_s / bf16.output_tok_s < 1.40


@pytest.mark.parametrize(("prompt_len", "low", "high"), [(512, 0.98, 1.02), (16384, 0.65, 0.85)])
def test_an_fp8_kv_cache_reads_faster_only_past_a_sequences_first_tokens(
    prompt_len: int, low: float, high: float
) -> None:
    """On the H200 an fp8 KV cache left chat's TPOT p50 where it was (~700-token contexts, 26.1
    -> 26.0 ms) and cut long_docs' from 75 to 62.5 ms (18k-token contexts):
    docs/sim-calibration.md."""
    kw = {"num_requests": 32, "concurrency": 32, "prompt_len": prompt_len, "output_len": 512}
    bf16 = simulate_closed_loop(_scheduler({}), **kw)  # all prefilled at once, then decoded
    fp8 = simulate_closed_loop(_scheduler({"kv_cache_dtype": "fp8"}), **kw)
    assert low < fp8.tpot_p50_s / bf16.tpot_p50_s < high


def test_small_kv_cache_preempts() -> None:
    sched = _scheduler({}, num_blocks=400)  # 6,400 tokens for 64 x 768
    res = simulate_closed_loop(
        sched, num_requests=64, concurrency=64, prompt_len=512, output_len=256
    )
    assert res.preemptions > 0
    assert sched.pool.used == 0 and not sched.has_work


def test_prefix_caching_hits() -> None:
    sched = _scheduler({})
    shared = list(range(1000, 1000 + 320))
    for i in range(4):
        sched.add(Request(f"r{i}", shared + [i] * 40, 2))
        while sched.has_work:
            sched.step()
    assert sched.stats.prefix_queries == 4 * 360
    assert sched.stats.prefix_hits == 3 * 320
    off = _scheduler({}, caching=False)
    off.add(Request("a", shared, 2))
    while off.has_work:
        off.step()
    assert off.stats.prefix_hits == 0


def test_every_request_gets_exactly_max_tokens() -> None:
    sched = _scheduler({"max_num_batched_tokens": 256, "max_num_seqs": 8})
    reqs = [Request(f"r{i}", list(range(i, i + 300)), 5 + i) for i in range(20)]
    for r in reqs:
        sched.add(r)
    while sched.has_work:
        sched.step()
    assert [r.num_output for r in reqs] == [5 + i for i in range(20)]
    assert sched.stats.generation_tokens == sum(5 + i for i in range(20))
