"""engine.preload's reading of engine.command: which interpreter and entry point a zygote runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tuner.engine.preload import Entry, entry_of
from tuner.errors import ConfigError


def _script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def test_python_dash_m_runs_the_module_with_its_arguments() -> None:
    got = entry_of([sys.executable, "-m", "tuner.sim", "serve", "/m", "--port", "1"])
    assert got == Entry(sys.executable, "-m tuner.sim", ("tuner.sim", "serve", "/m", "--port", "1"))


def test_a_console_script_runs_its_entry_point_under_its_own_interpreter(tmp_path: Path) -> None:
    # as pip writes vllm's: the interpreter on the #! line, the entry point imported below it
    vllm = _script(
        tmp_path / "vllm",
        "#!/opt/venv/bin/python3.12\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
        "from vllm.entrypoints.cli.main import main\nif __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        "    sys.exit(main())\n",
    )
    got = entry_of([vllm, "serve", "/m"])
    assert got == Entry(
        "/opt/venv/bin/python3.12", "vllm.entrypoints.cli.main:main", (vllm, "serve", "/m")
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('#!/bin/sh\nexec vllm "$@"\n', "is not a Python console script"),
        ("#!/usr/bin/python3\nprint('no entry point')\n", "is not a Python console script"),
    ],
)
def test_what_cannot_run_in_a_zygote_says_why(tmp_path: Path, text: str, why: str) -> None:
    got = entry_of([_script(tmp_path / "serve", text), "serve"])
    assert isinstance(got, str) and why in got


def test_a_missing_program_and_python_without_a_module_are_refused() -> None:
    assert "not found on PATH" in str(entry_of(["no-such-vllm-here", "serve"]))
    assert "runs no module" in str(entry_of([sys.executable, "script.py"]))


def test_preload_with_a_container_is_one_line_of_config_error(make_cfg) -> None:
    assert make_cfg("+workload=chat", "engine=vllm", "engine.preload=true").engine.preload
    with pytest.raises(ConfigError, match="engine.preload=false"):
        make_cfg("+workload=chat", "engine=docker", "engine.preload=true")


def test_the_dry_run_says_what_the_zygote_runs_or_why_it_cannot(make_cfg, tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from tuner.plan import print_plan

    def plan(*overrides: str) -> str:
        buf = io.StringIO()
        print_plan(make_cfg("+workload=chat", *overrides), Console(file=buf, width=400))
        return buf.getvalue()

    assert "engine.preload" not in plan("engine.preload=false")
    sim = plan()  # the simulator forks by default, as engine=vllm does
    assert f"each server forked from one {sys.executable} that imported -m tuner.sim" in sim
    wrapper = _script(tmp_path / "serve", '#!/bin/sh\nexec vllm serve "$@"\n')
    out = plan("engine=vllm", "engine.preload=true", f"engine.command=[{wrapper}]")
    assert f"engine.preload: {wrapper} is not a Python console script; each server will" in out


def test_vllm_forks_by_default_and_the_startup_benchmarks_plain_launch_does_not(
    make_cfg, tmp_path: Path
) -> None:
    """engine=vllm forks each server from the zygote and vLLM forks its EngineCore (measured on
    the H200, docs/gpu-runs/2026-12-05-capacity-study-fork.md), and so does the simulator's
    launch (no EngineCore of its own); a plain `vllm serve` launch does neither, and
    benchmarks/startup.py's ``plain`` stays that launch."""
    from helpers.benchmarks import load_benchmark

    vllm = make_cfg("+workload=chat", "engine=vllm")
    assert vllm.engine.preload and vllm.engine.env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    sim = make_cfg("+workload=chat")
    assert sim.engine.preload and "VLLM_WORKER_MULTIPROC_METHOD" not in sim.engine.env
    off = make_cfg(
        "+workload=chat",
        "engine=vllm",
        "engine.preload=false",
        "~engine.env.VLLM_WORKER_MULTIPROC_METHOD",
    )
    assert not off.engine.preload and "VLLM_WORKER_MULTIPROC_METHOD" not in off.engine.env
    bench = load_benchmark("startup")
    env = {n: bench.launch_env(vllm, tmp_path, n) for n in bench.LAUNCHERS}
    assert {n for n, e in env.items() if "VLLM_WORKER_MULTIPROC_METHOD" in e} == {
        "fork",
        "preload_fork",
    }


def test_a_ctrl_c_while_the_zygotes_end_at_exit_kills_them_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2026-12-07, on an H100: `timeout`'s SIGINT reached a finished run while its atexit hook
    waited for the zygote to end, and the log ended in a KeyboardInterrupt traceback. Now that
    zygote is killed at once, the others still end, and the exit hook raises nothing."""
    import subprocess

    from tuner.engine import preload
    from tuner.engine.process import kill_all_groups

    procs = [  # the first ends only when killed, the second when its stdin closes (a zygote's)
        subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True
        )
        for argv in (["sleep", "60"], ["cat"])
    ]
    first_wait = procs[0].wait

    def interrupted(timeout: float | None = None) -> int:
        if timeout is not None:  # the polite wait: the Ctrl-C lands here
            raise KeyboardInterrupt
        return first_wait()

    monkeypatch.setattr(procs[0], "wait", interrupted)
    for i, proc in enumerate(procs):
        zygote = object.__new__(preload.Zygote)
        zygote.proc = proc
        monkeypatch.setitem(preload._ZYGOTES, ("test", i), zygote)
    with pytest.raises(KeyboardInterrupt):  # a run's own stop lets the Ctrl-C through
        preload._ZYGOTES[("test", 0)].stop()
    assert procs[0].poll() is not None  # killed all the same
    kill_all_groups()  # no exception
    assert not preload._ZYGOTES
    assert all(p.poll() is not None for p in procs)
