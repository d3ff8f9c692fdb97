"""``engine=docker``: a trial's argv as a foreground ``docker run`` (tuner.engine.container), the
checks before the study, and the dry run's line. The servers themselves:
tests/integration/test_docker_engine.py, with the fake CLI of tests/helpers/fake_docker.py."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tuner.engine.argv import build_env, check_command, command_missing, trial_argv
from tuner.engine.container import check_image, wrap
from tuner.errors import ConfigError
from tuner.plan import print_plan

FAKE = Path(__file__).resolve().parents[1] / "helpers" / "fake_docker.py"


def option(argv: list[str], flag: str) -> list[str]:
    """Every value given to ``flag`` in ``argv``."""
    return [argv[i + 1] for i, w in enumerate(argv[:-1]) if w == flag]


def test_the_trial_argv_runs_after_the_image_with_docker_options_before(
    make_cfg, tmp_path: Path
) -> None:
    cfg = make_cfg("+workload=chat", "engine=docker", "engine.gpus=[2,3]")
    argv = trial_argv(cfg, {"max_num_seqs": 64}, port=1234, baseline=False)
    assert argv[:3] == ["vllm", "serve", cfg.model.path]  # the command run inside the image
    hf = tmp_path / "hf"
    hf.mkdir()
    environ = {"HF_TOKEN": "hf_secret_value", "PATH": "/bin", "OTHER": "x", "HF_HOME": str(hf)}
    cache = tmp_path / "state" / "vllm_cache"
    env = build_env(cfg.engine, cache_root=cache, environ=environ)
    out, cli_env = wrap(
        cfg.engine,
        argv,
        env,
        model_path=cfg.model.path,
        cache_root=cache,
        gpus=[2, 3],
        cidfile=tmp_path / "container.id",
        name="tuner-s-7-1234",
        extra_env=["TUNER_LEASE"],
    )
    image = "vllm/vllm-openai:v0.24.0"
    assert out[:2] == ["docker", "run"]
    assert out[out.index(image) + 1 :] == argv[1:]  # serve, the model, its flags
    assert option(out, "--entrypoint") == ["vllm"]
    assert option(out, "--gpus") == ['"device=2,3"']
    assert option(out, "--network") == ["host"] and option(out, "--ipc") == ["host"]
    assert option(out, "--pull") == ["never"]
    assert option(out, "--cidfile") == [str(tmp_path / "container.id")]
    assert option(out, "--name") == ["tuner-s-7-1234"]
    names = option(out, "-e")
    assert {"HF_TOKEN", "VLLM_SERVER_DEV_MODE", "VLLM_CACHE_ROOT", "HF_HOME"} <= set(names)
    assert "TUNER_LEASE" not in names  # not in env: only names the CLI has a value for
    assert not {"CUDA_VISIBLE_DEVICES", "PATH", "OTHER"} & set(names)
    assert all("=" not in n for n in names)  # names only: docker reads the values itself
    assert not any("hf_secret_value" in w for w in out)
    assert cli_env["HF_TOKEN"] == "hf_secret_value"  # the CLI has it, to pass it in
    assert cli_env["VLLM_CACHE_ROOT"] == str(cache)
    model = Path(cfg.model.path)
    assert option(out, "-v") == [f"{model}:{model}:ro", f"{cache}:{cache}", f"{hf}:{hf}"]


def test_no_hf_cache_mount_when_there_is_none(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg("+workload=chat", "engine=docker", "+engine.container.mounts=[/data:/data:ro]")
    env = build_env(cfg.engine, cache_root=None, environ={"HF_HOME": str(tmp_path / "none")})
    out, _ = wrap(
        cfg.engine,
        trial_argv(cfg, {}, port=1, baseline=True),
        env,
        model_path=cfg.model.path,
        cache_root=None,
        gpus=[0],
        cidfile="c",
        name="n",
    )
    model = Path(cfg.model.path)
    assert option(out, "-v") == [f"{model}:{model}:ro", "/data:/data:ro"]
    assert option(out, "--gpus") == ['"device=0"']
    assert "HF_HOME" not in option(out, "-e")


def test_sim_and_vllm_keep_their_argv(make_cfg) -> None:
    sim = trial_argv(make_cfg("+workload=chat"), {}, port=1, baseline=True)
    assert sim[:4] == [sys.executable, "-m", "tuner.sim", "serve"]
    vllm = trial_argv(make_cfg("+workload=chat", "engine=vllm"), {}, port=1, baseline=True)
    assert vllm[:2] == ["vllm", "serve"] and "docker" not in vllm


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``docker`` on PATH: tests/helpers/fake_docker.py; returns its state folder."""
    bin_dir, state = tmp_path / "bin", tmp_path / "docker-state"
    bin_dir.mkdir()
    state.mkdir()
    exe = bin_dir / "docker"
    exe.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_DIR", str(state))
    return state


def test_the_image_is_checked_before_the_study(
    make_cfg, fake_docker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_cfg("+workload=chat", "engine=docker")
    check_command(cfg.engine)  # on the machine: nothing to say
    monkeypatch.setenv("FAKE_DOCKER_IMAGES", "vllm/vllm-openai:v0.23.0")
    with pytest.raises(ConfigError) as missing:
        check_command(cfg.engine)
    assert str(missing.value) == (
        "engine.container.image 'vllm/vllm-openai:v0.24.0' is not on this machine (Error "
        "response from daemon: No such image: vllm/vllm-openai:v0.24.0): run `docker pull "
        "vllm/vllm-openai:v0.24.0` first; trials never pull"
    )
    monkeypatch.setenv("FAKE_DOCKER_DOWN", "1")
    with pytest.raises(ConfigError) as down:
        check_image(cfg.engine)
    assert str(down.value) == (
        "`docker image inspect vllm/vllm-openai:v0.24.0` failed: Cannot connect to the Docker "
        "daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
    )


def test_a_missing_docker_is_named(make_cfg) -> None:
    cfg = make_cfg("+workload=chat", "engine=docker", "engine.container.program=tuner-no-docker")
    assert command_missing(cfg.engine) == (
        "engine.container.program 'tuner-no-docker' is not found on PATH: install Docker"
    )
    with pytest.raises(ConfigError, match="tuner-no-docker"):
        check_command(cfg.engine)


def test_an_empty_image_is_refused(make_cfg) -> None:
    with pytest.raises(ConfigError, match="engine.container needs an image"):
        make_cfg("+workload=chat", "engine=docker", "engine.container.image=''")


def test_the_dry_run_shows_the_docker_run(make_cfg) -> None:
    cfg = make_cfg("+workload=chat", "engine=docker")
    buf = io.StringIO()
    print_plan(cfg, Console(file=buf, width=1000))
    out = buf.getvalue()
    assert "study chat-qwen3-8b-vllm-capacity · engine vllm" in out  # engine=vllm's study
    assert "each server in a container: docker run --cidfile <trial dir>/container.id " in out
    assert '--gpus "device=<lease>" --network host --ipc host' in out
    assert "--entrypoint vllm vllm/vllm-openai:v0.24.0 serve <model and flags as above>" in out
