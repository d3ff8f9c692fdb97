"""``replay(processes=P)`` (tuner.replay_procs) against the fake vLLM server of tests/helpers/fake_vllm.py."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.fake_vllm import FakeVLLM, run, spec

from tuner.config import ArrivalConfig
from tuner.errors import ReplayClientError
from tuner.records import RequestRecord
from tuner.replay import replay
from tuner.replay_procs import split_slots

ROOT = Path(__file__).resolve().parents[2]


def reset(fake: FakeVLLM) -> None:
    fake.received.clear()
    fake.in_flight_at_receipt.clear()
    fake.max_in_flight = 0


def fields(r: RequestRecord) -> tuple[Any, ...]:
    """What must not depend on the number of client processes (timings do)."""
    return (
        r.index,
        r.status,
        r.warmup,
        r.http_status,
        r.prompt_tokens,
        r.output_tokens,
        len(r.itl_s),
        r.error,
        r.ttft_s is not None,
        r.e2e_s is not None,
    )


def replay_children() -> list[multiprocessing.process.BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("tuner-replay-")]


def gone(pid: int) -> bool:
    """Not running any more (reaped, or a zombie waiting for a reaper)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return any(line.split()[1:2] == ["Z"] for line in status.splitlines() if line[:6] == "State:")


async def until(cond: Callable[[], bool], timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.01)


def test_split_slots() -> None:
    assert split_slots(10, 4) == [3, 3, 2, 2]
    assert split_slots(6, 3) == [2, 2, 2]
    assert split_slots(1, 3) == [1, 0, 0]
    assert sum(split_slots(1000, 7)) == 1000
    with pytest.raises(ValueError, match="cannot split"):
        split_slots(4, 0)


async def test_closed_loop_sends_each_once_within_the_bound(server: tuple[str, FakeVLLM]) -> None:
    """Three processes share five slots: every request once, never more than five in flight,
    the same records as one process, ``on_record`` called here for each."""
    base, fake = server
    specs = [
        spec(
            i,
            endpoint="chat" if i % 2 else "completions",
            max_tokens=2 + i % 4,
            x_ttft=0.03,
            x_itl=0.002,
            x_tag=f"r{i}",
            x_mode="http500" if i == 7 else "ok",
        )
        for i in range(40)
    ]
    arrival = ArrivalConfig(kind="concurrency", concurrency=5)
    single = await run(base, specs, arrival, api_key="sekret")
    reset(fake)
    seen: list[tuple[int, int, int]] = []
    children: set[str] = set()

    def on_record(r: RequestRecord) -> None:
        seen.append((os.getpid(), threading.get_ident(), r.index))
        children.update(p.name for p in replay_children())

    multi = await run(base, specs, arrival, api_key="sekret", processes=3, on_record=on_record)
    tags = sorted(b["x_tag"] for _, b, _ in fake.received)
    assert tags == sorted(f"r{i}" for i in range(40))  # each sent exactly once
    assert fake.max_in_flight <= 5
    assert children == {"tuner-replay-0", "tuner-replay-1", "tuner-replay-2"}
    assert [fields(r) for r in multi] == [fields(r) for r in single]
    assert multi[7].status == "error"
    assert multi[7].error == "boom: engine dead"
    assert all(h["Authorization"] == "Bearer sekret" for _, _, h in fake.received)
    assert all(b["model"] == "m" and b["stream"] is True for _, b, _ in fake.received)
    assert sorted(i for _, _, i in seen) == list(range(40))
    assert {(pid, tid) for pid, tid, _ in seen} == {(os.getpid(), threading.get_ident())}
    assert not replay_children()  # all exited and reaped


async def test_slots_split_over_processes(
    server: tuple[str, FakeVLLM], caplog: pytest.LogCaptureFixture
) -> None:
    """Concurrency 4 over 3 processes (2, 1, 1): a process holding all 4 would be caught."""
    base, fake = server
    specs = [spec(i, x_ttft=0.05) for i in range(24)]
    caplog.set_level(logging.INFO, logger="tuner.replay_procs")
    recs = await run(base, specs, ArrivalConfig(kind="concurrency", concurrency=4), processes=3)
    assert [r.status for r in recs] == ["ok"] * 24
    assert 2 <= fake.max_in_flight <= 4
    # what starting the processes cost, once per replay (the server waits meanwhile)
    said = [r.getMessage() for r in caplog.records if "processes ready in" in r.getMessage()]
    assert len(said) == 1 and re.fullmatch(
        r"  replay client: 3 processes ready in \d+\.\d s", said[0]
    )


async def test_more_processes_than_slots(server: tuple[str, FakeVLLM]) -> None:
    base, fake = server
    specs = [spec(i, x_ttft=0.02) for i in range(10)]
    children: set[str] = set()
    recs = await run(
        base,
        specs,
        ArrivalConfig(kind="concurrency", concurrency=2),
        processes=8,
        on_record=lambda r: children.update(p.name for p in replay_children()),
    )
    assert [r.index for r in recs] == list(range(10))
    assert fake.max_in_flight <= 2
    assert children == {"tuner-replay-0", "tuner-replay-1"}  # one process per slot at most


async def test_warmups_first_and_flagged(server: tuple[str, FakeVLLM]) -> None:
    base, fake = server
    specs = [spec(i, warmup=True, x_tag=f"w{i}", x_ttft=0.03) for i in range(4)]
    specs += [spec(4 + i, x_tag=f"m{i}", x_ttft=0.01) for i in range(10)]
    starts: list[float] = []
    seen: list[RequestRecord] = []
    recs = await run(
        base,
        specs,
        ArrivalConfig(kind="concurrency", concurrency=4),
        processes=2,
        on_start=starts.append,
        on_record=seen.append,
    )
    assert [(r.index, r.warmup) for r in recs] == [(i, i < 4) for i in range(14)]
    tags = [b["x_tag"] for _, b, _ in fake.received]
    assert sorted(tags[:4]) == ["w0", "w1", "w2", "w3"]  # every warm-up before any measured
    assert sorted(r.index for r in seen) == list(range(14))
    (t0,) = starts
    measured_receipts = [t for t, b, _ in fake.received if b["x_tag"].startswith("m")]
    assert min(measured_receipts) >= t0  # t_sent_s is relative to the start on_start reported
    assert all(r.t_sent_s >= 0 for r in recs if not r.warmup)


async def test_open_loop_arrivals_and_warmups(server: tuple[str, FakeVLLM]) -> None:
    base, fake = server
    arrivals = [0.03 * i for i in range(12)]
    specs = [spec(0, warmup=True, x_ttft=0.02), spec(1, warmup=True, x_ttft=0.02)]
    specs += [spec(2 + i, arrival_s=a, x_tag=f"m{i}") for i, a in enumerate(arrivals)]
    starts: list[float] = []
    recs = await run(
        base, specs, ArrivalConfig(kind="poisson", rate=30.0), processes=2, on_start=starts.append
    )
    assert [r.status for r in recs] == ["ok"] * 14
    assert fake.in_flight_at_receipt[:2] == [1, 1]  # warm-ups one by one for open loop
    tags = [b["x_tag"] for _, b, _ in fake.received[2:]]
    assert sorted(tags) == sorted(f"m{i}" for i in range(12))
    for r, a in zip(recs[2:], arrivals, strict=True):
        assert r.t_sent_s >= a - 1e-3  # never early: one clock for all processes
    (t0,) = starts
    assert min(t for t, b, _ in fake.received[2:]) >= t0


async def test_open_loop_cap_split(server: tuple[str, FakeVLLM]) -> None:
    """max_concurrency 3 over 3 processes: the total in flight never exceeds 3, later
    arrivals wait for a slot."""
    base, fake = server
    specs = [spec(i, arrival_s=0.0, x_ttft=0.05) for i in range(12)]
    arrival = ArrivalConfig(kind="constant", rate=100.0, max_concurrency=3)
    recs = await run(base, specs, arrival, processes=3)
    assert [r.status for r in recs] == ["ok"] * 12
    assert fake.max_in_flight <= 3
    assert max(r.t_sent_s for r in recs) >= 0.1  # 12 over 3 slots of 50 ms: some waited


async def test_duration_bound_stops_new_sends(server: tuple[str, FakeVLLM]) -> None:
    base, fake = server
    specs = [spec(i, x_ttft=0.1) for i in range(50)]
    arrival = ArrivalConfig(kind="concurrency", concurrency=2)
    recs = await run(base, specs, arrival, duration_s=0.35, processes=2)
    assert 1 <= len(recs) < 50
    assert len(fake.received) == len(recs)  # unsent requests produce no record
    assert all(r.t_sent_s < 0.35 for r in recs)
    assert all(r.status == "ok" for r in recs)


async def stalled_replay(server: tuple[str, FakeVLLM]) -> asyncio.Task[list[RequestRecord]]:
    """A 2-process replay whose requests never finish, once both processes have one in flight."""
    base, fake = server
    specs = [spec(i, x_ttft=30.0) for i in range(6)]
    task = asyncio.create_task(
        run(base, specs, ArrivalConfig(kind="concurrency", concurrency=2), processes=2)
    )
    await until(lambda: fake.in_flight >= 2 or task.done())
    return task


async def test_cancel_stops_the_children(server: tuple[str, FakeVLLM]) -> None:
    """A pruned replay (its task cancelled) leaves no client process behind."""
    task = await stalled_replay(server)
    pids = [p.pid for p in replay_children()]
    assert len(pids) == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert all(pid is not None and gone(pid) for pid in pids)
    assert not replay_children()


async def test_dead_child_is_an_error(server: tuple[str, FakeVLLM]) -> None:
    task = await stalled_replay(server)
    victim, other = replay_children()
    assert victim.pid is not None and other.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(ReplayClientError, match=r"replay client process \d .*exited unexpectedly"):
        await task
    assert gone(other.pid)


_ORPHAN_SCRIPT = """
import asyncio, multiprocessing, pathlib, sys
from tuner.config import ArrivalConfig
from tuner.records import RequestSpec
from tuner.replay import replay

specs = [
    RequestSpec(i, "completions", {"prompt": "hi", "max_tokens": 4, "x_ttft": 600.0}, 1, 4)
    for i in range(4)
]

async def main():
    task = asyncio.create_task(replay(
        sys.argv[1], "m", specs, ArrivalConfig(concurrency=2),
        duration_s=600.0, request_timeout_s=900.0, processes=2,
    ))
    while len(kids := multiprocessing.active_children()) < 2:
        await asyncio.sleep(0.01)
    pathlib.Path(sys.argv[2]).write_text(" ".join(str(p.pid) for p in kids))
    await task

asyncio.run(main())
"""


async def test_children_die_with_a_killed_parent(
    server: tuple[str, FakeVLLM], tmp_path: Path
) -> None:
    """``kill -9`` of the process running the replay: its client processes do not live on
    (their requests would hang for 10 minutes)."""
    base, fake = server
    out = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _ORPHAN_SCRIPT, base, str(out), env=env
    )  # no pipes: the children would hold them open
    pids: list[int] = []
    try:
        await until(lambda: out.exists() and len(out.read_text().split()) == 2, 120.0)
        pids = [int(x) for x in out.read_text().split()]
        await until(lambda: fake.in_flight >= 2)
        assert not any(gone(pid) for pid in pids)
        proc.kill()
        await proc.wait()
        await until(lambda: all(gone(pid) for pid in pids), timeout_s=30.0)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for pid in pids:  # a failed run must not leave its orphans behind
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


async def test_bad_process_counts(server: tuple[str, FakeVLLM]) -> None:
    base, _ = server
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match=r"^processes is .*; allowed: an integer >= 1$"):
            await replay(
                base,
                "m",
                [spec(0)],
                ArrivalConfig(),
                duration_s=1.0,
                request_timeout_s=1.0,
                processes=bad,  # type: ignore[arg-type]
            )
