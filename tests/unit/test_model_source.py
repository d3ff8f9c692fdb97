"""``model=custom``: a model directory or a Hugging Face repo id, and what is derived from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tuner.engine.argv import trial_argv
from tuner.errors import ConfigError
from tuner.model_source import context_length, derived_name, local_files
from tuner.workload.prompts import ChatTemplate

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ROOT / "models" / "qwen-0.5b-dummy"  # max_position_embeddings 32768
SHA = "0123456789abcdef0123456789abcdef01234567"


def model_dir(where: Path, name: str = "My-Qwen") -> Path:
    """A copy of a shipped shape (links followed), with no model YAML anywhere."""
    return Path(shutil.copytree(SHAPE, where / name))


def hf_cache(home: Path, repo_id: str) -> Path:
    """``home`` as ``HF_HOME`` with ``repo_id`` in its hub cache, laid out as huggingface_hub
    writes it (``models--org--name/refs/main`` → ``snapshots/<sha>/``); no weights."""
    repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(SHAPE, repo / "snapshots" / SHA)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    return repo / "snapshots" / SHA


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline Hugging Face cache under ``tmp_path/hf`` (huggingface_hub read ``HF_HOME`` and
    ``HF_HUB_OFFLINE`` when it was imported: its constants are set here as the env would)."""
    from huggingface_hub import constants

    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return home


def test_context_length_is_vllms_derivation() -> None:
    assert context_length({"max_position_embeddings": 40960}) == 40960
    # a vision-language model: text_config's
    assert context_length({"text_config": {"max_position_embeddings": 262144}}) == 262144
    # the smallest of the keys vLLM reads
    assert context_length({"max_position_embeddings": 8192, "seq_length": 4096}) == 4096
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert context_length({"max_position_embeddings": 40960, "rope_scaling": yarn}) == 131072
    linear = {"type": "linear", "factor": 2.0}
    assert context_length({"max_position_embeddings": 4096, "rope_scaling": linear}) == 8192
    llama3 = {"rope_type": "llama3", "factor": 8.0}  # states the scaled length already
    assert context_length({"max_position_embeddings": 131072, "rope_scaling": llama3}) == 131072
    mrope = {"rope_type": "default", "mrope_section": [24, 20, 20]}
    assert context_length({"max_position_embeddings": 262144, "rope_scaling": mrope}) == 262144
    assert context_length({"hidden_size": 8}) is None


def test_names_are_the_last_component_lower_cased() -> None:
    assert derived_name("Qwen/Qwen3-8B") == "qwen3-8b"
    assert derived_name("/models/my-llama/") == "my-llama"


def test_a_directory_is_used_as_it_is(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    assert local_files(str(d)) == d
    with pytest.raises(ConfigError, match="is not a directory, nor a Hugging Face repo id"):
        local_files(str(tmp_path / "nope" / "x"))


def test_a_repo_id_resolves_from_the_offline_cache(offline_hub: Path) -> None:
    snapshot = hf_cache(offline_hub, "Org/Tiny-Qwen")
    assert local_files("Org/Tiny-Qwen") == snapshot
    with pytest.raises(ConfigError) as err:
        local_files("Org/Not-Cached")
    assert "'Org/Not-Cached' is not a directory, and the repo is not in" in str(err.value)
    assert "(HF_HUB_OFFLINE is set)" in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_a_custom_directory_derives_name_length_and_real_weights(make_cfg, tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    cfg = make_cfg("+workload=chat", "model=custom", f"model.path={d}", "engine=vllm")
    m = cfg.model
    assert (m.name, m.max_model_len, m.load_format, m.files) == ("my-qwen", 32768, None, d)
    # the space's ${model.max_model_len} sees the derived value
    assert cfg.space.params["max_model_len"].choices[-1] == 32768
    assert cfg.space.params["max_model_len"].default == 32768
    argv = trial_argv(cfg, {}, port=1, baseline=True)
    assert argv[2] == str(d) and "--load-format" not in argv
    cfg = make_cfg("+workload=chat", "model=custom", f"model.path={d}", "model.load_format=dummy")
    assert trial_argv(cfg, {}, port=1, baseline=True)[-2:] == ["--load-format", "dummy"]
    cfg = make_cfg("+workload=chat", "model=custom", f"model.path={d}", "model.max_model_len=16384")
    assert cfg.model.max_model_len == 16384


def test_a_repo_id_is_served_as_given_and_read_from_the_cache(make_cfg, offline_hub: Path) -> None:
    snapshot = hf_cache(offline_hub, "Org/Tiny-Qwen")
    cfg = make_cfg("+workload=chat", "model=custom", "model.path=Org/Tiny-Qwen")
    assert (cfg.model.name, cfg.model.max_model_len) == ("tiny-qwen", 32768)
    assert cfg.model.files == snapshot
    argv = trial_argv(cfg, {}, port=1, baseline=True)
    assert "Org/Tiny-Qwen" in argv and str(snapshot) not in argv


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        # a shipped shape keeps its own name, length and dummy weights: refused, not kept silently
        (["model.path={d}"], "model.path is set on model=qwen3-8b, a shipped shape"),
        (["model=qwen-0.5b", "model.path={d}"], "use model=custom model.path=PATH"),
        (["model=custom", "model.path={e}"], "has no config.json"),
        (
            ["model=custom", "model.path={d}", "model.load_format=dummy"]
            + ["+model.fixed_args.load-format=dummy"],
            "the load format is given twice",
        ),
    ],
)
def test_model_mistakes_are_one_line(
    make_cfg, tmp_path: Path, overrides: list[str], needle: str
) -> None:
    d, e = model_dir(tmp_path), tmp_path / "empty"
    e.mkdir()
    with pytest.raises(ConfigError, match=needle):
        make_cfg("+workload=chat", *(o.format(d=d, e=e) for o in overrides))


def test_the_chat_template_file_wins(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    (d / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"
    )
    template = ChatTemplate(d)
    assert template.native
    assert template.render([{"role": "user", "content": "hi"}]) == "[user] hi\n[assistant]"


def test_a_short_context_model_keeps_the_length_choices_it_can_serve(
    make_cfg, tmp_path: Path
) -> None:
    d = model_dir(tmp_path, "Short")
    conf = json.loads((d / "config.json").read_text())
    conf["max_position_embeddings"] = 8192
    (d / "config.json").write_text(json.dumps(conf))
    cfg = make_cfg("+workload=chat", "model=custom", f"model.path={d}")
    spec = cfg.space.params["max_model_len"]
    # the default space's 16384 is dropped, and 8192 (listed and the model's own) kept once
    assert (cfg.model.max_model_len, spec.choices, spec.default) == (8192, [4096, 8192], 8192)
    conf["max_position_embeddings"] = 2048  # below every choice: one line, as before
    (d / "config.json").write_text(json.dumps(conf))
    cfg = make_cfg("+workload=chat", "model=custom", f"model.path={d}")
    assert cfg.space.params["max_model_len"].choices == [2048]
