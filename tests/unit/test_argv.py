from __future__ import annotations

import sys

import pytest

from tuner.engine.argv import (
    build_argv,
    build_env,
    flag_args,
    mask,
    mask_argv,
    passed,
    secret_values,
)
from tuner.precheck import passed_params
from tuner.space import defaults, resolved


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--enforce-eager", True, ["--enforce-eager"]),
        ("--enable-prefix-caching", False, ["--no-enable-prefix-caching"]),
        ("-cc.cudagraph_mode", "PIECEWISE", ["-cc.cudagraph_mode=PIECEWISE"]),
        ("--gpu-memory-utilization", 0.85, ["--gpu-memory-utilization", "0.85"]),
        ("--max-num-seqs", 256, ["--max-num-seqs", "256"]),
        ("--block-size", 32.0, ["--block-size", "32"]),
        ("--cudagraph-capture-sizes", [1, 2, 4], ["--cudagraph-capture-sizes", "1", "2", "4"]),
        ("--limit-mm-per-prompt", {"image": 4}, ["--limit-mm-per-prompt", '{"image":4}']),
        ("--max-model-len", None, []),
    ],
)
def test_flag_args(flag: str, value: object, expected: list[str]) -> None:
    assert flag_args(flag, value) == expected


def test_build_argv_trial_and_baseline(make_cfg) -> None:
    cfg = make_cfg("+workload=image_heavy")
    params = {"gpu_memory_utilization": 0.8, "enforce_eager": False, "cudagraph_mode": "PIECEWISE"}
    argv = build_argv(
        cfg.engine, cfg.model, cfg.space, params, port=1234, server_args=cfg.workload.server_args
    )
    assert argv[0] == sys.executable  # a leading "python" is this interpreter
    assert argv[argv.index("--port") + 1] == "1234"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--load-format") :][:2] == ["--load-format", "dummy"]
    assert "--limit-mm-per-prompt" in argv
    assert "-cc.cudagraph_mode=PIECEWISE" in argv
    assert "--no-enforce-eager" in argv
    base = build_argv(cfg.engine, cfg.model, cfg.space, params, port=1, baseline=True)
    assert "--gpu-memory-utilization" not in base and "-cc.cudagraph_mode=PIECEWISE" not in base


def test_when_condition_drops_cudagraph_mode_under_eager(make_cfg) -> None:
    cfg = make_cfg("+workload=chat")
    argv = build_argv(
        cfg.engine, cfg.model, cfg.space, {"enforce_eager": True, "cudagraph_mode": "FULL"}, port=1
    )
    assert "--enforce-eager" in argv
    assert not any(a.startswith("-cc.cudagraph_mode") for a in argv)


@pytest.mark.parametrize("eager", [False, True])
def test_the_argv_passes_what_passed_says(make_cfg, eager: bool) -> None:
    """One rule for which params become flags: the argv's searched flags are ``passed``'s, and
    the precheck (resolved params, disabled ones at their default) judges the same."""
    cfg = make_cfg("+workload=chat", "space=full")
    params = {
        **defaults(cfg.space),
        "enforce_eager": eager,
        "cudagraph_mode": "PIECEWISE",
        "max_cudagraph_capture_size": 256,
    }
    flags = passed(cfg.space, params)
    assert ("cudagraph_mode" in flags, "max_cudagraph_capture_size" in flags) == (not eager,) * 2
    assert flags["enforce_eager"] is eager and flags["max_num_seqs"] == params["max_num_seqs"]
    argv = build_argv(cfg.engine, cfg.model, cfg.space, params, port=1)
    assert ("-cc.cudagraph_mode=PIECEWISE" in argv) is not eager
    assert ("--max-cudagraph-capture-size" in argv) is not eager
    assert passed_params(cfg.space, resolved(cfg.space, params)) == flags
    default_space = make_cfg("+workload=chat").space  # enforce_eager disabled: not a flag
    searched = {**defaults(default_space), "cudagraph_mode": "PIECEWISE"}
    judged = passed_params(default_space, resolved(default_space, searched))
    assert judged == passed(default_space, searched) and "enforce_eager" not in judged


def test_the_simulated_server_models_engine_gpu(make_cfg) -> None:
    sim = make_cfg("+workload=chat", "engine=sim", "engine.gpu=h100").engine
    assert build_env(sim, cache_root=None, environ={})["TUNER_SIM_GPU"] == "h100"
    mine = {"TUNER_SIM_GPU": "h200"}  # the user's own setting stays
    assert build_env(sim, cache_root=None, environ=mine)["TUNER_SIM_GPU"] == "h200"
    real = make_cfg("+workload=chat", "engine=vllm", "engine.gpu=h100").engine
    assert "TUNER_SIM_GPU" not in build_env(real, cache_root=None, environ={})


def test_env_lease_no_vllm_port_and_secrets(make_cfg) -> None:
    cfg = make_cfg("+workload=chat", "engine=vllm", "engine.gpus=[2,3]")
    environ = {"VLLM_PORT": "9000", "HF_TOKEN": "hf_secret_value", "PATH": "/bin"}
    env = build_env(cfg.engine, cache_root=None, environ=environ)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "VLLM_PORT" not in env
    assert env["HF_TOKEN"] == "hf_secret_value"
    assert env["VLLM_NO_USAGE_STATS"] == "1"
    secrets = secret_values(cfg.engine, environ)
    assert secrets == ["hf_secret_value"]
    assert mask("token=hf_secret_value!", secrets) == "token=***!"
    assert mask_argv(["x", "--api-key", "abc123", "--api-key=abc123"], []) == [
        "x",
        "--api-key",
        "***",
        "--api-key=***",
    ]


def test_api_key_flag_is_a_secret_and_the_client_key(make_cfg) -> None:
    from tuner.engine.argv import api_key

    cfg = make_cfg("+workload=chat", "engine.extra_args=[--api-key,sk-123456]")
    assert "sk-123456" in secret_values(cfg.engine, {}, cfg.model)
    assert api_key(cfg.engine, cfg.model, {}) == "sk-123456"
    # every secret-named flag's value is a secret (vLLM's --hf-token), wherever it is given;
    # a flag whose name only contains such a word is not (its number must stay readable)
    hf = make_cfg(
        "+workload=chat",
        "engine.extra_args=['--hf-token=hf_abcdef']",
        "+model.fixed_args.hf-token=hf_ghijkl",
        "+model.fixed_args.max-num-batched-tokens=8192",
        "+model.fixed_args.long-prefill-token-threshold=2048",
    )
    found = secret_values(hf.engine, {}, hf.model)
    assert found == ["hf_abcdef", "hf_ghijkl"] or found == ["hf_ghijkl", "hf_abcdef"]
    assert api_key(hf.engine, hf.model, {}) is None
    plain = make_cfg("+workload=chat")
    assert api_key(plain.engine, plain.model, {"VLLM_API_KEY": "envkey"}) == "envkey"
    assert api_key(plain.engine, plain.model, {}) is None
