"""engine.preload: servers forked from one preloaded interpreter (tuner.engine.preload, .zygote).

The zygote is real (a subprocess in its own session); the servers are the simulator, as the
launcher starts it, or ``helpers.zygote_child``, a stand-in that prints what it was given."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.procs import sim_server

from tuner.engine import preload
from tuner.engine.process import Preload, Server, group_members
from tuner.errors import FailureReason, LaunchFailed

pytestmark = pytest.mark.integration  # fast tier: the tests marked fast (a launch or none)

ROOT = Path(__file__).resolve().parents[2]
TESTS = str(ROOT / "tests")
CHILD = [sys.executable, "-m", "helpers.zygote_child"]


@pytest.fixture(autouse=True)
def _no_zygote_left() -> object:
    preload.stop_all()  # an in-process study of another module forked the simulator (its default)
    yield
    preload.stop_all()


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": TESTS, "TUNER_SIM_SPEEDUP": "20", **extra}


def _sim(tmp_path: Path, name: str, *flags: str) -> Server:
    forked = Preload(("tuner.sim.server",), tmp_path / "zygote.log")
    return sim_server(tmp_path / f"{name}.log", *flags, env=_env(), preload=forked)


def _wait_gone(pgid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.fast
async def test_launches_share_one_zygote_each_server_in_its_own_group(tmp_path: Path) -> None:
    pids = []
    for name in ("a", "b"):
        server = _sim(tmp_path, name, "--gpu-memory-utilization", "0.5")
        async with server as info:
            assert isinstance(server.proc, preload.ForkedProcess)
            assert server.pgid == info.pid and len(group_members(info.pid)) >= 2
            assert info.facts.kv_cache_tokens and info.facts.kv_cache_tokens > 0
            assert info.startup is not None and "process" in info.startup.phases
            assert info.preloaded is True
        assert server.survivors == [] and group_members(info.pid) == []
        assert server.proc.wait(timeout=5) is not None  # the zygote reported the exit
        pids.append(info.pid)
        # the server's own lines are in its log; its port is this launch's
        assert f"'port': {server.port}" in (tmp_path / f"{name}.log").read_text()
    zygotes = list(preload._ZYGOTES.values())
    assert len(zygotes) == 1 and zygotes[0].alive and set(pids) <= set(zygotes[0].exits)


@pytest.mark.fast
async def test_a_failed_start_is_classified_as_without_preload(tmp_path: Path) -> None:
    failures = []
    for name in ("forked", "plain"):
        server = _sim(tmp_path, name, "--block-size", "24")
        server.preload = server.preload if name == "forked" else None
        with pytest.raises(LaunchFailed) as e:
            async with server:
                pass
        assert isinstance(server.proc, preload.ForkedProcess) == (name == "forked")
        failures.append((e.value.reason, str(e.value)))
    assert failures[0] == failures[1]
    assert failures[0][0] is FailureReason.INVALID_CONFIG


@pytest.mark.fast
async def test_a_command_no_zygote_can_run_starts_as_a_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = _sim(tmp_path, "plain")
    server.argv = ["/bin/sh", "-c", 'exec "$@"', "sh", *server.argv]
    async with server as info:
        assert isinstance(server.proc, subprocess.Popen) and info.pid > 0
        assert info.preloaded is None
    assert "engine.preload: /bin/sh is not a Python console script" in caplog.text
    assert not preload._ZYGOTES


def _zygote(tmp_path: Path) -> preload.Zygote:
    entry = preload.entry_of(CHILD)
    assert isinstance(entry, preload.Entry)
    zygote = preload.Zygote(entry, ["json", "no_such_module_here"], _env(), tmp_path / "z.log")
    zygote.wait_ready(30)
    return zygote


def _forked(zygote: preload.Zygote, tmp_path: Path, name: str, *args: str, **env: str) -> int:
    return zygote.fork([*CHILD[2:], *args], _env(**env), str(tmp_path), tmp_path / f"{name}.log")


def _printed(tmp_path: Path, name: str) -> dict:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = (tmp_path / f"{name}.log").read_text() if (tmp_path / f"{name}.log").exists() else ""
        if text.strip():
            return json.loads(text.splitlines()[0])
        time.sleep(0.05)
    raise AssertionError(f"{name} printed nothing")


@pytest.mark.fast
def test_each_child_gets_its_argv_environment_cwd_and_exit_code(tmp_path: Path) -> None:
    zygote = _zygote(tmp_path)
    assert "no_such_module_here" in (tmp_path / "z.log").read_text() or zygote.import_s is not None
    a = _forked(zygote, tmp_path, "a", "3", ZYGOTE_GPU="0")
    b = _forked(zygote, tmp_path, "b", "0", ZYGOTE_GPU="1")
    seen_a, seen_b = _printed(tmp_path, "a"), _printed(tmp_path, "b")
    assert seen_a["argv"] == ["3"] and seen_a["env"] == {"ZYGOTE_GPU": "0"}
    assert seen_b["env"] == {"ZYGOTE_GPU": "1"} and seen_b["cwd"] == str(tmp_path)
    assert seen_a["pgid"] == a and seen_b["pgid"] == b  # each leads its own group
    # sys.path as `python -m` sets it: the working directory first, not the zygote's folder
    assert seen_a["path"][0] == str(tmp_path)
    assert str(ROOT / "tuner" / "engine") not in seen_a["path"]
    assert preload.ForkedProcess(zygote, a).wait(10) == 3
    assert preload.ForkedProcess(zygote, b).wait(10) == 0
    assert (tmp_path / "a.log").read_text().splitlines()[-1] == "atexit ran"
    zygote.stop()


@pytest.mark.fast
def test_stopping_the_zygote_kills_the_servers_it_forked(tmp_path: Path) -> None:
    zygote = _zygote(tmp_path)
    pid = _forked(zygote, tmp_path, "s", "sleep")
    _printed(tmp_path, "s")
    assert group_members(pid) == [pid]
    zygote.stop()
    assert _wait_gone(pid)


@pytest.mark.fast
def test_a_tuner_killed_with_sigkill_leaves_no_forked_server(tmp_path: Path) -> None:
    # a forked server's /proc environ is the zygote's (no lease marker for tuner.recovery):
    # the zygote sees its stdin close when its tuner dies and kills what it forked
    code = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from tuner.engine import preload\n"
        f"tmp = Path({str(tmp_path)!r})\n"
        "entry = preload.entry_of([sys.executable, '-m', 'helpers.zygote_child'])\n"
        "z = preload.Zygote(entry, [], dict(os.environ), tmp / 'z.log')\n"
        "z.wait_ready(30)\n"
        "env = dict(os.environ)\n"
        "print(z.fork(['helpers.zygote_child', 'sleep'], env, str(tmp), tmp / 's.log'), flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=_env()
    )
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        assert group_members(pid) == [pid]  # the zygote answers once the server leads its group
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert _wait_gone(pid)
    finally:
        owner.kill()
        owner.wait()


def test_a_study_with_preload_forks_every_server_from_one_zygote(tmp_path: Path) -> None:
    from helpers.cli import FAST, tuner

    p = tuner(
        tmp_path,
        "+workload=chat",
        "engine=sim",
        "engine.preload=true",
        "study.n_trials=2",
        "confirm.rounds=1",
        "tracking=none",
        *FAST,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert out.count("engine.preload: -m tuner.sim preloaded in") == 1
    assert "starting each server as a process" not in out
    run = next((tmp_path / "outputs" / "runs").iterdir())
    results = [json.loads(r.read_text()) for r in sorted(run.glob("trial_*/result.json"))]
    assert len(results) == 2 and all(r["launch"]["startup"]["phases"] for r in results)
    assert all(r["launch"]["preloaded"] is True for r in results)
    assert out.count("forked from the preloaded interpreter") >= 2
    # the confirm stage's fresh server came from the same zygote, which logs beside the run
    # one candidate or two, as the two trials' measured capacities fall
    assert re.search(r"confirm: [12] candidate\(s\) x 1 round\(s\)", out), out[-3000:]
    assert next(run.glob("confirm/trial_*/round_1/server.log")).read_text()
    assert (run / "zygote.log").exists()


@pytest.mark.fast
def test_one_zygote_per_environment_less_the_per_launch_variables(tmp_path: Path) -> None:
    seen = []
    for gpu in ("0", "1"):
        child = preload.fork_server(
            CHILD + ["0"],
            _env(ZYGOTE_GPU=gpu),
            tmp_path / f"gpu{gpu}.log",
            modules=[],
            zygote_log=tmp_path / "z.log",
            timeout_s=30,
            per_launch=("ZYGOTE_GPU",),
            cpus=[0],
        )
        assert child.wait(10) == 0
        seen.append(_printed(tmp_path, f"gpu{gpu}"))
    assert [s["env"] for s in seen] == [{"ZYGOTE_GPU": "0"}, {"ZYGOTE_GPU": "1"}]
    assert all(s["cpus"] == [0] for s in seen)  # pinned in the child, before it ran
    (zygote,) = preload._ZYGOTES.values()
    # the zygote itself started without them: no launch's lease marker in its /proc environ
    assert b"ZYGOTE_GPU" not in Path(f"/proc/{zygote.proc.pid}/environ").read_bytes()


@pytest.mark.fast
def test_a_server_gets_what_the_preloaded_imports_set_in_the_environment(tmp_path: Path) -> None:
    # a process launched afresh would run the same imports and get the same changes; the
    # per-launch variable keeps its launch's value
    child = preload.fork_server(
        CHILD + ["0"],
        _env(ZYGOTE_GPU="3", ZYGOTE_DROPPED_AT_IMPORT="x", ZYGOTE_KEPT="y"),
        tmp_path / "c.log",
        modules=["helpers.zygote_env_import"],
        zygote_log=tmp_path / "z.log",
        timeout_s=30,
        per_launch=("ZYGOTE_GPU",),
    )
    assert child.wait(10) == 0
    assert _printed(tmp_path, "c")["env"] == {
        "ZYGOTE_GPU": "3",
        "ZYGOTE_SET_AT_IMPORT": "1",
        "ZYGOTE_KEPT": "y",
    }


def test_kill_9_of_a_preloading_tuner_leaves_no_server_and_the_next_run_recovers(
    tmp_path: Path,
) -> None:
    import uuid

    from helpers.cli import FAST, tuner
    from helpers.procs import kill_9_once_serving, marked_pids

    name, value = "TUNER_TEST_MARK", uuid.uuid4().hex
    env = {**os.environ, name: value}  # every process of this tuner carries it, forked or not
    args = ["+workload=chat", "study.n_trials=1", "engine.preload=true", "objective=throughput"]
    kill_9_once_serving(tmp_path, [*args, "engine.env.TUNER_SIM_SPEEDUP=1"], env)
    deadline = time.monotonic() + 10
    while marked_pids(f"{name}={value}") and time.monotonic() < deadline:
        time.sleep(0.1)
    # the zygote saw its stdin close and killed the server it forked, then exited
    assert marked_pids(f"{name}={value}") == [], "a forked server outlived its SIGKILLed tuner"
    p = tuner(tmp_path, *args, *FAST, "confirm.enabled=false", env={name: value})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "recovered: trial 0" in p.stderr + p.stdout
    assert marked_pids(f"{name}={value}") == []


@pytest.mark.fast
def test_a_zygote_that_cannot_start_says_why_once(tmp_path: Path) -> None:
    script = tmp_path / "sim-serve"
    script.write_text("#!/nonexistent/python3\nfrom tuner.sim.__main__ import main\n")
    script.chmod(0o755)
    for _ in range(2):  # the second launch is refused at once, from memory
        with pytest.raises(preload.PreloadError, match="cannot start /nonexistent/python3"):
            preload.fork_server(
                [str(script), "serve"],
                _env(),
                tmp_path / "s.log",
                modules=[],
                zygote_log=tmp_path / "z.log",
                timeout_s=5,
            )
    assert not preload._ZYGOTES and len(preload._FAILED) == 1


@pytest.mark.fast
async def test_a_forked_server_that_hangs_silent_is_started_as_a_process_and_forking_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    forked = Preload(("helpers.fork_marker",), tmp_path / "zygote.log", silent_s=1.0)
    servers = []
    for name in ("first", "second"):
        server = sim_server(tmp_path / f"{name}.log", env=_env(), preload=forked)
        server.argv[2] = "helpers.hang_when_forked"  # python -m <this> serve ...
        servers.append(server)
    first, second = servers
    async with first as info:
        assert isinstance(first.proc, subprocess.Popen) and info.preloaded is None
        assert info.facts.kv_cache_tokens  # the simulator, started as a process
        assert info.startup_s > 1.0  # the second lost to the silent fork is counted
    hung = [pid for z in preload._ZYGOTES.values() for pid in z.exits]
    assert len(hung) == 1 and _wait_gone(hung[0])  # the fork was stopped, its group gone
    assert caplog.text.count("a forked server wrote nothing in 1 s") == 1
    async with second as info:  # no fork tried: no second lost, nothing said again
        assert isinstance(second.proc, subprocess.Popen) and info.preloaded is None
    assert [pid for z in preload._ZYGOTES.values() for pid in z.exits] == hung
    assert caplog.text.count("a forked server wrote nothing") == 1
    preload.stop_all()  # a new run forks again
    assert not preload._OFF
