"""The real launcher (tuner.engine.process.Server) against the simulator as a subprocess."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import aiohttp
import pytest
from helpers.procs import sim_server

from tuner.engine.process import Server, free_port, group_members
from tuner.errors import FailureReason, LaunchFailed, ReplayFailed

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def make_server(
    tmp_path: Path, *flags: str, env: dict[str, str] | None = None, timeout: float = 30.0
) -> Server:
    return sim_server(tmp_path / "server.log", *flags, env=env, timeout=timeout)


async def test_ready_facts_and_clean_teardown(tmp_path: Path) -> None:
    server = make_server(tmp_path, "--gpu-memory-utilization", "0.5")
    async with server as info:
        assert info.facts.kv_cache_tokens and info.facts.kv_cache_tokens > 0
        assert info.facts.max_concurrency and info.facts.max_concurrency > 0
        assert info.facts.engine_version and info.facts.engine_version.startswith("0.24")
        assert info.startup_s > 0
        pgid = server.pgid
        assert pgid is not None
        assert len(group_members(pgid)) >= 2  # API server + its EngineCore child
    assert server.survivors == []
    assert group_members(pgid) == []
    assert server.stop_s is not None


async def test_the_simulated_server_has_the_memory_of_engine_gpu(make_cfg, tmp_path: Path) -> None:
    from tuner.engine.argv import build_env
    from tuner.memory import GPU_PROFILES, ModelShape, estimate

    shape = ModelShape.from_dir(ROOT / "models" / "qwen-0.5b-dummy")
    for gpu in ("h100", "h200"):
        env = build_env(make_cfg("+workload=chat", f"engine.gpu={gpu}").engine, cache_root=None)
        async with make_server(tmp_path / gpu, env=env) as info:
            assert info.facts.kv_cache_tokens == estimate(shape, GPU_PROFILES[gpu], {}).kv_tokens


async def test_cpu_pinning_covers_the_server_and_its_engine_core(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    server.cpus = [0]
    async with server:
        assert server.pgid is not None
        members = group_members(server.pgid)
        assert len(members) >= 2  # the API server and the EngineCore it spawned after the pin
        for pid in members:
            assert os.sched_getaffinity(pid) == {0}, pid


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--gpu-memory-utilization", "0.005"], FailureReason.NO_KV_MEMORY),
        (["--swap-space", "4"], FailureReason.INVALID_CONFIG),
        (["--gpu-memory-utilization", "1.5"], FailureReason.INVALID_CONFIG),
        (["--block-size", "24"], FailureReason.INVALID_CONFIG),
    ],
)
async def test_startup_failures_are_classified(
    tmp_path: Path, flags: list[str], reason: FailureReason
) -> None:
    server = make_server(tmp_path, *flags)
    with pytest.raises(LaunchFailed) as e:
        async with server:
            pass
    assert e.value.reason is reason, e.value.detail
    assert server.survivors == []


async def test_kv_too_small_on_8b(tmp_path: Path) -> None:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "tuner.sim",
        "serve",
        str(ROOT / "models" / "qwen3-8b-dummy"),
        "--port",
        str(port),
        "--gpu-memory-utilization",
        "0.15",
        "--max-model-len",
        "40960",
    ]
    server = Server(
        argv,
        env=dict(os.environ),
        log_path=tmp_path / "s.log",
        host="127.0.0.1",
        port=port,
        startup_timeout_s=30,
        stop_timeout_s=5,
        health_interval_s=0.1,
    )
    with pytest.raises(LaunchFailed) as e:
        await server.start()
    await server.stop()
    assert e.value.reason is FailureReason.KV_TOO_SMALL
    assert "max seq len" in e.value.detail


async def test_gpu_busy(tmp_path: Path) -> None:
    server = make_server(tmp_path, env={"TUNER_SIM_USED_GIB": "60"})
    with pytest.raises(LaunchFailed) as e:
        async with server:
            pass
    assert e.value.reason is FailureReason.GPU_BUSY


async def test_startup_timeout_kills_the_group(tmp_path: Path) -> None:
    server = make_server(tmp_path, env={"TUNER_SIM_HANG": "1"}, timeout=1.5)
    with pytest.raises(LaunchFailed) as e:
        async with server:
            pass
    assert e.value.reason is FailureReason.STARTUP_TIMEOUT
    assert server.pgid is not None and group_members(server.pgid) == []


async def test_engine_death_after_ready_is_detected(tmp_path: Path) -> None:
    import asyncio

    server = make_server(tmp_path, env={"TUNER_SIM_DIE_AFTER_S": "0.3"})

    async def poll(http: aiohttp.ClientSession) -> None:
        for _ in range(50):
            await server.check(http)
            await asyncio.sleep(0.1)

    async with server, aiohttp.ClientSession() as http:
        with pytest.raises(ReplayFailed) as e:
            await poll(http)
        assert e.value.reason is FailureReason.ENGINE_DEAD
    assert server.survivors == []


@pytest.mark.fast
async def test_the_simulator_queues_a_first_rounds_connections_as_vllm_does(
    tmp_path: Path,
) -> None:
    """vLLM listens with uvicorn's backlog (2048); the simulator did with aiohttp's 128, and a
    closed loop's first round, a connection per slot at once, lost the ones past it to the
    kernel's retry a second later. With the HTTP front stopped (SIGSTOP: it accepts nothing),
    the kernel completes the handshake of every connection the listen queue holds and drops the
    others' SYNs: 600 connect within 0.8 s (the first SYN retry comes after 1 s)."""
    import asyncio
    import select
    import signal
    import socket
    import time

    n = 600
    somaxconn = Path("/proc/sys/net/core/somaxconn")
    if int(await asyncio.to_thread(somaxconn.read_text)) < n:
        pytest.skip("net.core.somaxconn caps every listen queue below 600 here")
    server = make_server(tmp_path)
    async with server:
        assert server.pgid is not None
        socks: list[socket.socket] = []
        os.kill(server.pgid, signal.SIGSTOP)  # the API server: the process that accepts
        try:
            poll = select.poll()
            for _ in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", server.port))
                poll.register(s.fileno(), select.POLLOUT)
                socks.append(s)
            by_fd = {s.fileno(): s for s in socks}
            connected: set[int] = set()
            deadline = time.monotonic() + 0.8
            while len(connected) < n and (left := deadline - time.monotonic()) > 0:
                for fd, _ in poll.poll(left * 1000):
                    poll.unregister(fd)
                    if by_fd[fd].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                        connected.add(fd)
            assert len(connected) == n
        finally:
            for s in socks:
                s.close()
            os.kill(server.pgid, signal.SIGCONT)
