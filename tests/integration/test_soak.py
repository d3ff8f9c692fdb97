"""Soak: 18 consecutive simulator trials with forced start-up failures, engine deaths after ready
and start-up timeouts, then a study stopped with Ctrl-C — afterwards no process the tuner
started is alive and no port it used is still listening."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from helpers.procs import marked_pids

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL = [
    "tracking=none",
    "workload.num_requests=6",
    "workload.warmup_requests=0",
    "workload.arrival.concurrency=3",
    "workload.output_tokens.low=4",
    "workload.output_tokens.high=8",
    "engine.env.TUNER_SIM_SPEEDUP=20",
    # the confirm stage of a study with feasible trials (launch-failures): one fresh server per
    # candidate, not three rounds of them (4 servers, ~7 s)
    "confirm.rounds=1",
]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_consecutive_trials_leave_nothing_behind(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    env = {**os.environ, "TUNER_SOAK_MARK": mark}
    storage = f"sqlite:///{tmp_path / 'outputs' / 'state' / 'optuna.db'}"

    def run(name: str, n: int, *extra: str) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "tuner",
                "+workload=chat",
                f"study.name={name}",
                f"study.n_trials={n}",
                *SMALL,
                *extra,
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        assert marked_pids(mark) == [], f"processes left after {name}"
        return p

    # infeasible corners (those of space=full: the default space has none), launched: two of
    # them enqueued (random draws of 6 trials once found none, in CI), then the sampler's
    run(
        "launch-failures",
        6,
        "space=full",
        "study.precheck=false",
        "study.enqueue=[{gpu_memory_utilization:0.1},"
        "{enable_chunked_prefill:false,max_num_batched_tokens:2048}]",
    )
    # the engine dies 0.1 s after it is ready, while a 30-request replay runs
    run("deaths", 6, "+engine.env.TUNER_SIM_DIE_AFTER_S=0.1", "workload.num_requests=30")
    run("timeouts", 6, "+engine.env.TUNER_SIM_HANG=1", "engine.startup_timeout_s=0.5")

    def launched() -> int:
        return len(
            [d for d in tmp_path.glob("outputs/runs/*/trial_*") if (d / "server.log").exists()]
        )

    before = launched()  # the precheck kept some of the 18 from launching
    proc = subprocess.Popen(  # a normal study, interrupted with Ctrl-C after some trials
        [
            sys.executable,
            "-m",
            "tuner",
            "+workload=chat",
            "study.name=interrupted",
            "study.n_trials=25",
            *SMALL,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and launched() < before + 6:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    time.sleep(0.5)
    assert marked_pids(mark) == [], "processes left after Ctrl-C"

    summaries = {s.study_name: s for s in optuna.get_all_study_summaries(storage)}
    total = sum(s.n_trials for s in summaries.values())
    assert total >= 18 + 6, total  # 18 + the interrupted study's trials up to Ctrl-C

    def reasons(name: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in optuna.load_study(study_name=name, storage=storage).trials:
            r = t.user_attrs.get("failure_reason") or "ok"
            out[r] = out.get(r, 0) + 1
        return out

    startup = {"invalid_config", "no_kv_memory", "kv_too_small"}
    assert startup & set(reasons("launch-failures")), reasons("launch-failures")
    deaths = reasons("deaths")
    assert deaths.get("engine_dead", 0) + deaths.get("replay_errors", 0) >= 3, deaths
    timeouts = reasons("timeouts")  # how many launch depends on what the precheck rejects
    assert timeouts.get("startup_timeout", 0) >= 2, timeouts
    assert set(timeouts) <= startup | {"startup_timeout"}, timeouts

    ports = []  # the OS may hand out one free port twice: count trials, not distinct ports
    for result in tmp_path.glob("outputs/runs/*/trial_*/result.json"):
        argv = json.loads(result.read_text())["argv"]
        ports.append(int(argv[argv.index("--port") + 1]))
    assert len(ports) >= before  # every launched trial of the first three studies wrote its argv
    assert [p for p in ports if listening(p)] == []
