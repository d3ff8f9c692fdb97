from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from helpers.models import DEFAULTS, SHAPE

from tuner.errors import FailureReason, TrialFailed
from tuner.memory import GPU_PROFILES, estimate
from tuner.precheck import precheck
from tuner.records import RequestSpec
from tuner.sim.cli import parse_args
from tuner.sim.startup import Refusal, engine_check, resolve
from tuner.space import resolved

ROOT = Path(__file__).resolve().parents[2]


def spec(n: int) -> RequestSpec:
    return RequestSpec(index=0, endpoint="chat", body={}, prompt_tokens=n, output_tokens=100)


@pytest.mark.parametrize(
    ("gpus", "params", "needle"),
    [
        ([0], {"tensor_parallel_size": 2}, "exceeds the GPU lease"),
        ([0, 1, 2], {"tensor_parallel_size": 3}, "does not divide the 32"),
        ([0], {"max_model_len": 4096}, "max_model_len 4096 is shorter"),
    ],
)
def test_tuner_limits_always_apply(make_cfg, gpus, params, needle) -> None:
    cfg = make_cfg("+workload=chat", "space=full", f"engine.gpus={gpus}")
    for veto in (True, False):
        with pytest.raises(TrialFailed) as e:
            precheck(cfg, SHAPE, {**DEFAULTS, **params}, [spec(8000), spec(300)] * 5, veto=veto)
        assert e.value.reason is FailureReason.PRECHECK
        assert needle in e.value.detail


def test_h200_reference_points(make_cfg) -> None:
    """The hand-made reference runs (docs/gpu-runs/2026-11-30-h200-reference.md): defaults start
    (814,368 KV tokens logged); gmu 0.12 fails; the GPU run of 2026-11-30: gmu 0.15 at
    max_model_len 40960 fails (4.5 GiB KV < 5.62 needed)."""
    cfg = make_cfg("+workload=chat", "space=full")
    ok = precheck(cfg, SHAPE, DEFAULTS, [])
    assert ok.kv_tokens == pytest.approx(814_368, rel=0.02)
    for gmu in (0.12, 0.15):
        with pytest.raises(TrialFailed) as e:
            precheck(cfg, SHAPE, {**DEFAULTS, "gpu_memory_utilization": gmu}, [])
        assert e.value.reason in (FailureReason.NO_KV_MEMORY, FailureReason.KV_TOO_SMALL)
        assert e.value.detail.startswith("predicted before launch: ")
    # veto off: predicted, not rejected (the trial launches and vLLM refuses)
    v = precheck(cfg, SHAPE, {**DEFAULTS, "gpu_memory_utilization": 0.12}, [], veto=False)
    assert v.kv_tokens == 0


def test_borderline_configs_still_launch(make_cfg) -> None:
    """A predicted KV-too-small within the model's error margin is launched, not vetoed."""
    cfg = make_cfg("+workload=chat", "space=full")
    gpu = GPU_PROFILES["h200"]
    # find the gmu where the predicted KV just falls short of one 40960-token request
    gmu = 0.20
    while estimate(SHAPE, gpu, {**DEFAULTS, "gpu_memory_utilization": gmu}).failure is None:
        gmu -= 0.001
    est = estimate(SHAPE, gpu, {**DEFAULTS, "gpu_memory_utilization": gmu})
    assert est.failure is FailureReason.KV_TOO_SMALL
    v = precheck(cfg, SHAPE, {**DEFAULTS, "gpu_memory_utilization": gmu}, [])
    assert v.kv_tokens == 0  # predicted to fail, but within the margin: launch and see


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 2048}, "smaller than"),
        ({"max_num_seqs": 1024, "max_num_batched_tokens": 512}, "greater than or equal"),
    ],
)
def test_vllm_validation_rules(make_cfg, params, needle) -> None:
    cfg = make_cfg("+workload=chat", "space=full")
    with pytest.raises(TrialFailed) as e:
        precheck(cfg, SHAPE, {**DEFAULTS, **params}, [])
    assert e.value.reason is FailureReason.INVALID_CONFIG
    assert needle in e.value.detail
    # the baseline passes no flag: vLLM's rules for user-set values do not apply
    precheck(cfg, SHAPE, {**DEFAULTS, **params}, [], baseline=True)


def test_vllm_validation_message_is_vllms(make_cfg) -> None:
    """The detail is vLLM's own text after "predicted before launch: " (tuner.vllm_rules)."""
    cfg = make_cfg("+workload=chat", "space=full")
    with pytest.raises(TrialFailed) as e:
        precheck(
            cfg,
            SHAPE,
            {**DEFAULTS, "enable_chunked_prefill": False, "max_num_batched_tokens": 2048},
            [],
        )
    assert e.value.detail == (
        "predicted before launch: max_num_batched_tokens (2048) is smaller than max_model_len "
        "(40960). This effectively limits the maximum sequence length to max_num_batched_tokens "
        "and makes vLLM reject longer sequences. Please increase max_num_batched_tokens or "
        "decrease max_model_len."
    )
    with pytest.raises(TrialFailed) as e:
        precheck(cfg, SHAPE, {**DEFAULTS, "block_size": 24}, [])
    assert e.value.reason is FailureReason.INVALID_CONFIG
    assert e.value.detail.startswith(
        "predicted before launch: No valid attention backend found for cuda with "
        "AttentionSelectorConfig(head_size=128, dtype=torch.bfloat16, kv_cache_dtype=auto, "
        "block_size=24,"
    )


GRID: dict[str, list[Any]] = {
    "enable_chunked_prefill": [None, True, False],
    "max_num_batched_tokens": [None, 256, 2048, 40960],
    "max_num_seqs": [None, 512, 4096],
    "max_model_len": [None, 1024, 40960],
    "block_size": [None, 24, 32],
}


def _sim_refuses(params: dict[str, Any]) -> bool:
    """The simulated server refuses ``vllm serve`` with exactly these flags (invalid_config)."""
    argv = ["serve", str(ROOT / "models" / "qwen3-8b-dummy")]
    for key, value in params.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
    try:
        engine_check(resolve(parse_args(argv), {}), {}, "backend")
    except Refusal as exc:
        return exc.reason is FailureReason.INVALID_CONFIG
    return False


def test_vetoes_exactly_what_the_simulated_server_refuses(make_cfg) -> None:
    """Over a grid of passed flags (vLLM's defaults for the rest), the precheck's invalid_config
    is exactly the simulated server's refusal — no more (nothing vLLM accepts is vetoed)."""
    cfg = make_cfg("+workload=chat", "space=full")
    vetoed = refused = 0
    for combo in itertools.product(*GRID.values()):
        params = {k: v for k, v in zip(GRID, combo, strict=True) if v is not None}
        try:
            precheck(cfg, SHAPE, params, [])
            invalid = False
        except TrialFailed as e:
            invalid = e.reason is FailureReason.INVALID_CONFIG
        sim = _sim_refuses(params)
        assert invalid == sim, params
        vetoed += invalid
        refused += sim
    assert 0 < vetoed < len(list(itertools.product(*GRID.values())))


def test_a_disabled_param_is_not_passed(make_cfg) -> None:
    """A disabled param stays at vLLM's default, which vLLM derives from what *is* passed."""
    params = {"enable_chunked_prefill": False}
    on = make_cfg("+workload=chat", "space=full")
    with pytest.raises(TrialFailed) as e:  # passed: --max-num-batched-tokens 8192 < 40960
        precheck(on, SHAPE, resolved(on.space, params), [])
    assert e.value.reason is FailureReason.INVALID_CONFIG
    off = make_cfg(
        "+workload=chat", "space=full", "space.params.max_num_batched_tokens.enabled=false"
    )
    # not passed: vLLM makes the budget max(max_model_len, 8192) and starts
    precheck(off, SHAPE, resolved(off.space, params), [])
    assert not _sim_refuses({"enable_chunked_prefill": False})
    # likewise an unpassed max_num_seqs is clamped to the budget
    seqs_off = make_cfg("+workload=chat", "space=full", "space.params.max_num_seqs.enabled=false")
    precheck(seqs_off, SHAPE, resolved(seqs_off.space, {"max_num_batched_tokens": 512}), [])
    with pytest.raises(TrialFailed):
        precheck(on, SHAPE, resolved(on.space, {"max_num_batched_tokens": 512}), [])


def test_a_flag_whose_when_fails_is_not_passed(make_cfg) -> None:
    cfg = make_cfg("+workload=chat", "space=full")
    cfg.space.params["max_num_batched_tokens"].when = {"enable_chunked_prefill": True}
    params = {**DEFAULTS, "enable_chunked_prefill": False, "max_num_batched_tokens": 2048}
    precheck(cfg, SHAPE, params, [])  # --max-num-batched-tokens is not passed
    cfg.space.params["max_num_batched_tokens"].when = None
    with pytest.raises(TrialFailed):
        precheck(cfg, SHAPE, params, [])


def test_rules_the_model_is_unsure_of_are_not_vetoed(make_cfg) -> None:
    """The simulated server refuses these, but real vLLM may accept them: a max_model_len above
    max_position_embeddings (RoPE scaling raises vLLM's derived limit) and a KV-cache dtype the
    simulator has no backend for."""
    cfg = make_cfg("+workload=chat", "space=full")
    precheck(cfg, SHAPE, {**DEFAULTS, "max_model_len": 50000}, [])
    precheck(cfg, SHAPE, {**DEFAULTS, "kv_cache_dtype": "nvfp4"}, [])
    assert _sim_refuses({"max_model_len": 50000})
    assert _sim_refuses({"kv_cache_dtype": "nvfp4"})


def test_unknown_gpu_vetoes_only_what_fails_with_either_defaults(make_cfg) -> None:
    """Without a GPU profile vLLM's default budget (8192 on big GPUs, 2048 on small) is unknown."""
    cfg = make_cfg(
        "+workload=chat",
        "space=full",
        "engine.gpu=unknown",
        "space.params.max_num_batched_tokens.enabled=false",
    )
    full = resolved(cfg.space, {"max_num_seqs": 4096})
    assert precheck(cfg, SHAPE, full, []).estimate is None  # accepted on a big GPU
    with pytest.raises(TrialFailed) as e:
        precheck(cfg, SHAPE, resolved(cfg.space, {"max_num_seqs": 16384}), [])
    assert e.value.reason is FailureReason.INVALID_CONFIG
