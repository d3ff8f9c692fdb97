"""``best-*.yaml`` for ``vllm serve --config``: the recorded argv becomes the mapping vLLM 0.24's
``load_config_file`` turns back into the same flags, and every key is one of its parser's options
(tests/data/vllm-0.24.0-serve-flags.json, dumped from vLLM 0.24.0's own parser)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from tuner.export import (
    ExportError,
    config_argv,
    parse_serve_args,
    serve_command,
    to_yaml,
    write_export,
)

FLAGS_FILE = Path(__file__).resolve().parents[1] / "data" / "vllm-0.24.0-serve-flags.json"

ARGV = [
    "/models/qwen3-8b-dummy",
    "--host",
    "127.0.0.1",
    "--port",
    "40123",
    "--served-model-name",
    "m",
    "--load-format",
    "dummy",
    "--gpu-memory-utilization",
    "0.87",
    "--max-model-len",
    "-1",
    "--block-size",
    "32",
    "--no-enable-prefix-caching",
    "--enforce-eager",
    "-cc.cudagraph_mode=PIECEWISE",
    "-cc.max_cudagraph_capture_size=64",
    "--cudagraph-capture-sizes",
    "1",
    "2",
    "4",
    "--limit-mm-per-prompt",
    '{"image":4}',
    "--kv-cache-dtype",
    "fp8",
    "--api-key",
    "***",
]
DROP = ["host", "port", "served-model-name", "api-key"]


def test_parse_maps_every_argv_form() -> None:
    model, args = parse_serve_args(ARGV)
    assert model == "/models/qwen3-8b-dummy"
    assert args["gpu-memory-utilization"] == 0.87
    assert args["max-model-len"] == -1  # a negative number is a value, not a flag
    assert args["no-enable-prefix-caching"] is True
    assert args["enforce-eager"] is True
    assert args["compilation-config"] == {
        "cudagraph_mode": "PIECEWISE",
        "max_cudagraph_capture_size": 64,
    }
    assert args["cudagraph-capture-sizes"] == [1, 2, 4]
    assert args["limit-mm-per-prompt"] == {"image": 4}
    assert args["kv-cache-dtype"] == "fp8"


def test_yaml_round_trips_through_vllms_config_rules() -> None:
    config, text = to_yaml(ARGV, drop=DROP, header=["made by a test"])
    assert text.startswith("# made by a test\n")
    loaded = yaml.safe_load(text)
    assert loaded == config
    assert loaded["model"] == "/models/qwen3-8b-dummy"
    assert not {"host", "port", "served-model-name", "api-key"} & set(loaded)
    # what vLLM's load_config_file makes of it, parsed again, is the launched flags minus DROP
    _, again = parse_serve_args(config_argv({k: v for k, v in loaded.items() if k != "model"}))
    _, launched = parse_serve_args(ARGV)
    assert again == {k: v for k, v in launched.items() if k not in DROP}


def test_a_string_false_is_not_turned_into_a_boolean_vllm_would_drop() -> None:
    config, text = to_yaml(["/m", "--some-mode", "false", "--other", "1e3"])
    assert yaml.safe_load(text)["some-mode"] == "false"
    assert config_argv({"some-mode": config["some-mode"]}) == ["--some-mode", "false"]
    assert config["other"] == "1e3"  # 1e3 would come back as 1000.0 if made a number


def test_command_is_the_same_flags_shell_quoted(tmp_path: Path) -> None:
    config, _ = to_yaml(ARGV, drop=DROP)
    cmd = serve_command(config)
    words = shlex.split(cmd)
    assert words[:3] == ["vllm", "serve", "/models/qwen3-8b-dummy"]
    rest = {k: v for k, v in config.items() if k != "model"}
    assert words[3:] == config_argv(rest)
    yml, sh = write_export(tmp_path, "goodput", ARGV, drop=DROP, header=["h"])
    assert yml.name == "best-goodput.yaml" and sh.name == "best-goodput.sh"
    assert cmd in sh.read_text() and sh.stat().st_mode & 0o111


def test_unknown_short_flag_and_stray_value_are_errors() -> None:
    with pytest.raises(ExportError, match="unknown short flag"):
        parse_serve_args(["/m", "-zz", "1"])
    with pytest.raises(ExportError, match="needs one value"):
        parse_serve_args(["/m", "-cc.mode", "1", "2"])


def _vllm_options() -> dict[str, dict]:
    data = json.loads(FLAGS_FILE.read_text())
    assert data["vllm_version"] == "0.24.0"
    return data["options"]


def test_every_exported_key_is_an_option_of_vllm_0_24_serve() -> None:
    options = _vllm_options()
    config, _ = to_yaml(ARGV, drop=DROP)
    for key, value in config.items():
        opt = options.get("--" + key)
        assert opt is not None, f"--{key} is not a vllm serve 0.24.0 option"
        if value is True:
            assert not opt["takes_value"], f"--{key} needs a value"
        else:
            assert opt["takes_value"], f"--{key} takes no value"
        if opt.get("choices") and not isinstance(value, bool):
            assert str(value) in [str(c) for c in opt["choices"]], (key, value)


def test_flag_data_knows_the_searched_flags() -> None:
    """The space's flags (conf/space/full.yaml) must all exist in vLLM 0.24 (no invented
    flags, such as the seeds' --enable-cuda-graphs)."""
    from tuner.checks import load_config
    from tuner.space import flag_name

    options = _vllm_options()
    cfg = load_config(["+workload=chat", "space=full", "paths.output_dir=/tmp/x"])
    for name, spec in cfg.space.params.items():
        flag = flag_name(name, spec).split(".")[0]
        flag = {"-cc": "--compilation-config"}.get(flag, flag)
        assert flag in options, f"{name}: {flag} is not a vllm serve 0.24.0 option"
        if spec.type == "bool":
            assert "--no-" + flag[2:] in options, f"{flag} has no --no- form"
    assert "--enable-cuda-graphs" not in options
