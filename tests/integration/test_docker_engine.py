"""``engine=docker`` end to end, with the fake ``docker`` of tests/helpers/fake_docker.py (its "container"
is the simulator in a session of its own: ending the CLI's process group leaves it running, as
with the real CLI)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import types
from pathlib import Path
from typing import Any

import optuna
import pytest
from helpers.cli import FAST, storage, tuner
from helpers.procs import kill_9_once_serving, marked_pids

from tuner import precheck
from tuner.config import ContainerConfig, EngineConfig
from tuner.engine.container import ContainerServer, docker_argv
from tuner.engine.process import Server, free_port
from tuner.errors import FailureReason, LaunchFailed
from tuner.measure import Replay
from tuner.memory import ModelShape
from tuner.recovery import recover
from tuner.telemetry import gpu
from tuner.trial import TrialContext, run_server
from tuner.workload import build_requests

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "helpers" / "fake_docker.py"
IMAGE = "vllm/vllm-openai:v0.24.0"
TOKEN = "hf_fake_token_value_123"


def install(tmp_path: Path) -> dict[str, str]:
    """``docker`` first on PATH; the environment to run the tuner or a server with."""
    bin_dir, state = tmp_path / "bin", tmp_path / "docker-state"
    bin_dir.mkdir()
    state.mkdir()
    exe = bin_dir / "docker"
    exe.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    exe.chmod(0o755)
    root = str(ROOT)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_DOCKER_DIR": str(state),
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
        "HF_TOKEN": TOKEN,
    }


def calls(env: dict[str, str]) -> list[list[str]]:
    path = Path(env["FAKE_DOCKER_DIR"]) / "argv.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def container_pid(env: dict[str, str], cid: str) -> int:
    return int((Path(env["FAKE_DOCKER_DIR"]) / f"{cid}.pid").read_text())


def test_a_study_runs_each_server_in_a_container_and_removes_it(tmp_path: Path) -> None:
    env = install(tmp_path)
    p = tuner(
        tmp_path,
        "+workload=chat",
        "engine=docker",
        "engine.gpus=[1]",
        "engine.health_interval_s=0.1",
        "engine.stop_timeout_s=5",
        "study.n_trials=2",
        "confirm.enabled=false",
        "tracking=none",
        *(a.replace("engine.env.", "+engine.env.") for a in FAST),  # docker.yaml has no such key
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    recorded = calls(env)
    assert TOKEN not in json.dumps(recorded) + p.stdout + p.stderr
    assert recorded[0] == ["image", "inspect", "--format", "{{.Id}}", IMAGE]
    runs = [c for c in recorded if c[0] == "run"]
    study = optuna.load_study(study_name="chat-qwen3-8b-vllm", storage=storage(tmp_path))
    trials = sorted(study.trials, key=lambda t: t.number)
    assert len(runs) == len(trials) == 2
    for run, trial in zip(runs, trials, strict=True):
        words = run[run.index(IMAGE) + 1 :]
        assert words == trial.user_attrs["argv"][1:]  # serve, the model, the trial's flags
        assert trial.user_attrs["failure_reason"] is None
        assert "--network" in run and run[run.index("--network") + 1] == "host"
        assert run[run.index("--gpus") + 1] == '"device=1"'
        assert run[run.index("--entrypoint") + 1] == "vllm"
        names = [run[i + 1] for i, w in enumerate(run) if w == "-e"]
        assert {"HF_TOKEN", "TUNER_SIM_SPEEDUP", "VLLM_CACHE_ROOT", "TUNER_LEASE"} <= set(names)
        tdir = Path(trial.user_attrs["trial_dir"])
        cid = (tdir / "container.id").read_text().strip()
        assert run[run.index("--cidfile") + 1] == str(tdir / "container.id")
        stop = ["stop", "-t", "5", cid]
        assert stop in recorded and ["rm", "-f", cid] in recorded
        assert recorded.index(stop) < recorded.index(["rm", "-f", cid])
        assert not alive(container_pid(env, cid))
        assert "GPU KV cache size" in (tdir / "server.log").read_text()  # the log, captured
    assert len(runs[1]) > len(runs[0])  # the sampled trial's flags; the baseline passes none


async def test_stop_removes_the_container_a_killed_cli_leaves(tmp_path: Path) -> None:
    env = {**os.environ, **install(tmp_path), "TUNER_SIM_SPEEDUP": "20"}
    model = str(ROOT / "models" / "qwen3-8b-dummy")
    engine = EngineConfig(kind="vllm", command=["vllm", "serve"], container=ContainerConfig())

    async def serve(kind: type[Server], name: str) -> tuple[str, int]:
        port = free_port()
        cidfile = tmp_path / f"{name}.id"
        inner = ["vllm", "serve", model, "--host", "127.0.0.1", "--port", str(port)]
        argv = docker_argv(
            engine,
            inner + ["--load-format", "dummy", "--max-model-len", "4096"],
            gpus=[0],
            env_names=["TUNER_SIM_SPEEDUP"],
            volumes=[],
            cidfile=cidfile,
            name=name,
        )
        extra = {"program": "docker", "cidfile": cidfile} if kind is ContainerServer else {}
        server = kind(
            argv,
            env=env,
            log_path=tmp_path / f"{name}.log",
            host="127.0.0.1",
            port=port,
            startup_timeout_s=60,
            stop_timeout_s=5,
            health_interval_s=0.1,
            **extra,
        )
        async with server:
            pass
        cid = cidfile.read_text().strip()
        return cid, container_pid(env, cid)

    # the plain process lifecycle ends the CLI's group only: the container runs on
    cid, pid = await serve(Server, "plain")
    assert alive(pid), "the fake CLI must behave as docker's: its container outlives it"
    assert not any(c[0] in ("stop", "rm") for c in calls(env))
    os.killpg(pid, 9)  # the container's every process (its EngineCore child too)
    # the container lifecycle stops and removes it by its id
    cid, pid = await serve(ContainerServer, "boxed")
    assert not alive(pid)
    assert ["stop", "-t", "5", cid] in calls(env) and ["rm", "-f", cid] in calls(env)


async def test_a_container_that_cannot_start_is_one_line_and_removed(tmp_path: Path) -> None:
    error = 'could not select device driver "" with capabilities: [[gpu]]'
    env = {**os.environ, **install(tmp_path), "FAKE_DOCKER_RUN_ERROR": error}
    engine = EngineConfig(kind="vllm", command=["vllm", "serve"], container=ContainerConfig())
    cidfile = tmp_path / "container.id"
    argv = docker_argv(
        engine,
        ["vllm", "serve", "/m"],
        gpus=[0],
        env_names=[],
        volumes=[],
        cidfile=cidfile,
        name="n",
    )
    server = ContainerServer(
        argv,
        program="docker",
        cidfile=cidfile,
        env=env,
        log_path=tmp_path / "server.log",
        host="127.0.0.1",
        port=free_port(),
        startup_timeout_s=30,
        stop_timeout_s=5,
    )
    with pytest.raises(LaunchFailed) as failed:
        async with server:
            pass
    assert failed.value.reason is FailureReason.CRASH
    assert failed.value.detail == f"exit code 125: docker: Error response from daemon: {error}"
    cid = cidfile.read_text().strip()
    assert ["rm", "-f", cid] in calls(env)  # created, so removed


def test_kill_9_leaves_the_container_running_and_recovery_removes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tuner dies mid-trial (SIGKILL): its container runs on, and cannot be found through
    /proc (a real one's processes are root's; the fake hides TUNER_LEASE from it). Recovery
    removes it by its label ``tuner.lease=<lease id>``."""
    env = install(tmp_path)
    args = [
        "+workload=chat",
        "engine=docker",
        "engine.health_interval_s=0.1",
        "study.n_trials=1",
        "confirm.enabled=false",
        "tracking=none",
        "+engine.env.TUNER_SIM_SPEEDUP=20",
        "workload.num_requests=400",
    ]
    kill_9_once_serving(tmp_path, args, {**os.environ, **env})
    leases = tmp_path / "outputs" / "state" / "leases"
    (lease_file,) = leases.glob("*.json")
    lease = json.loads(lease_file.read_text())
    cid = (Path(lease["trial_dir"]) / "container.id").read_text().strip()
    pid = container_pid(env, cid)
    try:
        assert alive(pid), "the container outlives a SIGKILLed tuner"
        assert lease["id"].encode() not in Path(f"/proc/{pid}/environ").read_bytes()
        (run,) = [c for c in calls(env) if c[0] == "run"]
        assert run[run.index("--label") + 1] == f"tuner.lease={lease['id']}"
        assert lease["container_program"] == "docker"

        monkeypatch.setenv("PATH", env["PATH"])
        monkeypatch.setenv("FAKE_DOCKER_DIR", env["FAKE_DOCKER_DIR"])
        study = optuna.load_study(
            study_name="chat-qwen3-8b-vllm-capacity", storage=storage(tmp_path)
        )
        recovered = recover(study, leases, [])
        assert not alive(pid), "the container the dead tuner left was not removed"
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    label = f"label=tuner.lease={lease['id']}"
    assert ["ps", "-aq", "--no-trunc", "--filter", label] in calls(env)
    assert ["rm", "-f", cid] in calls(env)
    assert marked_pids(f"TUNER_LEASE={lease['id']}") == [], "the docker CLI was not stopped"
    assert f"removed container(s) {cid[:12]}" in recovered.notes[0]
    assert not list(leases.glob("*.json"))
    (trial,) = study.get_trials()
    assert trial.state == optuna.trial.TrialState.FAIL
    assert trial.user_attrs["failure_reason"] == "interrupted"


def fake_nvml(state: Path, leaks: bool) -> Any:
    """A stand-in pynvml: one 140 GiB H200 that uses 100 GiB while a fake container runs (with
    ``leaks``: from its start on, for good), none otherwise."""
    gib = 1 << 30

    def used() -> int:
        pids = [int(f.read_text()) for f in state.glob("*.pid")]
        started = any(p > 0 for p in pids)
        running = any(
            alive(int(f.read_text())) and not (state / f"{f.stem}.removed").exists()
            for f in state.glob("*.pid")
        )
        return 100 * gib if running or (leaks and started) else 0

    def mem(h: int, version: int | None = None) -> Any:
        u = used()
        return types.SimpleNamespace(used=u, free=140 * gib - u, total=140 * gib)

    return types.SimpleNamespace(
        nvmlMemory_v2=0x2000028,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=mem,
        nvmlDeviceGetName=lambda h: "NVIDIA H200",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=50),
        nvmlDeviceGetPowerUsage=lambda h: 300_000,
    )


@pytest.mark.parametrize("leaks", [False, True])
async def test_the_gpu_memory_is_checked_free_after_the_container_is_removed(
    make_cfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog, leaks: bool
) -> None:
    env = install(tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    state = Path(env["FAKE_DOCKER_DIR"])
    monkeypatch.setattr(gpu, "pynvml", fake_nvml(state, leaks))
    gpu._reset()
    precheck.leased_gpu.cache_clear()
    try:
        cfg = make_cfg(
            "+workload=chat",
            "engine=docker",
            "engine.health_interval_s=0.1",
            "engine.gpu_free_timeout_s=1",
            "+engine.env.TUNER_SIM_SPEEDUP=20",
            "objective=throughput",  # one replay: the check after the stop is what is tested
            "workload.num_requests=6",
            "workload.warmup_requests=0",
            "workload.output_tokens.low=8",
            "workload.output_tokens.high=16",
        )
        requests = build_requests(cfg.workload, cfg.model.files)
        ctx = TrialContext(
            cfg, ModelShape.from_dir(cfg.model.files), requests, [], tmp_path / "run", None, "s"
        )
        tdir = tmp_path / "run" / "trial_0000"
        with caplog.at_level(logging.INFO, logger="tuner"):
            (result,) = await run_server(
                ctx, 0, {}, True, tdir, [Replay("", requests, cfg.workload)], prune=False
            )
    finally:
        gpu._reset()
        precheck.leased_gpu.cache_clear()
    assert result.failure_reason is None  # a leak is a warning, never the trial's failure
    assert result.metrics["gpu_used_before_launch_gib"] == 0.0
    cid = (tdir / "container.id").read_text().strip()
    assert ["rm", "-f", cid] in calls(env)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if leaks:
        assert result.metrics["gpu_used_after_stop_gib"] == 100.0
        (line,) = [w for w in warned if "still used" in w]
        assert f"after container {cid[:12]} stopped" in line
        assert line.startswith("GPUs [0]: 100.0 GiB still used 1 s after")
    else:
        assert result.metrics["gpu_used_after_stop_gib"] == 0.0
        assert not [w for w in warned if "still used" in w]
