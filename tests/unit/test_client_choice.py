"""``workload.client_processes=auto``: how many replay client processes a replay takes
(``tuner.replay.choose_client``), the config knob, and what the dry run and a late client say."""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Callable
from dataclasses import replace

import pytest
from rich.console import Console

import tuner.replay as replay_mod
from tuner.config import ArrivalConfig, EngineConfig, WorkloadConfig, usable_cores
from tuner.errors import ConfigError
from tuner.measure import warn_client_lag
from tuner.plan import print_plan
from tuner.records import RequestSpec
from tuner.replay import (
    IN_PROCESS_STREAMS,
    STEP_S,
    STREAMS_PER_PROCESS,
    choose_client,
    client_cores,
    in_flight,
    processes_for,
)


def specs(n: int, *, arrivals: list[float] | None = None, tokens: int = 100) -> list[RequestSpec]:
    """``n`` measured requests (closed loop without ``arrivals``) after two warm-ups."""
    warm = [RequestSpec(i, "chat", {}, 10, tokens, warmup=True) for i in range(2)]
    return warm + [
        RequestSpec(2 + i, "chat", {}, 10, tokens, None if arrivals is None else arrivals[i])
        for i in range(n)
    ]


@pytest.fixture
def cores(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """``cores(n)``: this process may use ``n`` CPU cores (as ``tuner.replay`` sees them)."""

    def set_cores(n: int) -> None:
        monkeypatch.setattr(replay_mod, "usable_cores", lambda: n)

    return set_cores


# --- the rule -----------------------------------------------------------------------------------


def test_small_loads_stay_in_the_tuners_process() -> None:
    for bound in range(1, IN_PROCESS_STREAMS + 1):
        assert processes_for(bound, 64) == 1


def test_above_the_threshold_separate_processes_at_most_streams_per_process() -> None:
    assert processes_for(IN_PROCESS_STREAMS + 1, 64) == 2  # not the tuner's own process
    assert processes_for(64, 64) == 4
    assert processes_for(65, 64) == 5
    assert processes_for(256, 64) == 16
    assert processes_for(1000, 64) == 63
    assert processes_for(1000, 11) == 11  # the cores usable cap it
    for bound in range(IN_PROCESS_STREAMS + 1, 2000, 7):
        p = processes_for(bound, 10_000)
        assert p >= 2 and math.ceil(bound / p) <= STREAMS_PER_PROCESS
        assert processes_for(bound, 10_000) <= bound  # never more than the requests in flight


def test_the_cores_cap_it() -> None:
    assert processes_for(1000, 23) == 23
    assert processes_for(256, 2) == 2
    assert processes_for(256, 1) == 1  # one core: the tuner's own process
    assert processes_for(64, 1) == 1
    for cores in range(1, 40):
        for bound in (9, 64, 256, 1000, 5000):
            assert 1 <= processes_for(bound, cores) <= min(cores, bound)


def test_in_flight_closed_loop_is_its_concurrency() -> None:
    assert in_flight(ArrivalConfig(concurrency=64), specs(300)) == 64
    assert in_flight(ArrivalConfig(concurrency=64), specs(10)) == 10  # fewer requests than slots
    assert in_flight(ArrivalConfig(concurrency=64), specs(0)) == 1


def test_in_flight_open_loop_from_the_busiest_stretch() -> None:
    open_s = 100 * STEP_S  # 100 output tokens a stream: 2.5 s open
    rate = 40.0
    steady = [i / rate for i in range(400)]
    est = in_flight(ArrivalConfig(kind="constant"), specs(400, arrivals=steady))
    assert est == pytest.approx(rate * open_s, abs=1)  # Little's law
    # a burst of 50 at once in an otherwise slow stream counts as 50
    burst = [0.0] * 50 + [10.0 + i for i in range(50)]
    assert in_flight(ArrivalConfig(kind="poisson"), specs(100, arrivals=burst)) == 50
    # max_concurrency caps the estimate; a trace (send times) is open loop whatever kind says
    capped = ArrivalConfig(kind="concurrency", concurrency=4, max_concurrency=30)
    assert in_flight(capped, specs(400, arrivals=steady)) == 30


def test_client_cores_unpinned_leave_one_per_gpu(cores) -> None:
    cores(32)
    assert client_cores(EngineConfig())[0] == 31
    assert client_cores(EngineConfig(gpus=[0, 1]))[0] == 30
    cores(2)
    n, why = client_cores(EngineConfig())
    assert (n, why) == (1, "2 cores less 1 for the server")
    cores(1)
    assert client_cores(EngineConfig(gpus=[0, 1]))[0] == 1


def test_client_cores_pinned_are_the_reserve(cores) -> None:
    cores(32)
    pinned = EngineConfig(cpu_pinning=True, cpu_reserve=8, gpus=[0, 1])
    assert client_cores(pinned) == (8, "engine.cpu_reserve=8 under engine.cpu_pinning")
    # reserve 0: the tuner stays unpinned, on the servers' cores
    assert client_cores(replace(pinned, cpu_reserve=0))[0] == 30


def test_choose_client_follows_each_replays_load(cores) -> None:
    cores(32)
    w = WorkloadConfig(name="chat", arrival=ArrivalConfig(concurrency=64))
    assert w.client_processes == "auto"  # the default
    base = choose_client(w, EngineConfig(), specs(300))
    assert (base.processes, base.in_flight, base.auto, base.held) == (4, 64, True, False)
    # a capacity step or a confirm run at 4x: the same workload at its own load
    harder = replace(w, arrival=ArrivalConfig(concurrency=256))
    assert choose_client(harder, EngineConfig(), specs(800)).processes == 16
    small = replace(w, arrival=ArrivalConfig(concurrency=4))
    assert choose_client(small, EngineConfig(), specs(300)).processes == 1
    # an integer is used as given, whatever the load
    fixed = replace(harder, client_processes=3)
    choice = choose_client(fixed, EngineConfig(), specs(800))
    assert (choice.processes, choice.auto) == (3, False)


def test_on_two_cores_auto_is_the_single_in_process_client(cores) -> None:
    cores(2)
    w = WorkloadConfig(name="chat", arrival=ArrivalConfig(concurrency=64))
    choice = choose_client(w, EngineConfig(), specs(300))
    assert (choice.processes, choice.wanted, choice.held) == (1, 4, True)
    assert choice.describe() == (
        "1 process, the tuner's own (auto): 64 requests in flight call for 4 (at most 16 "
        "streams each), held to 1 by the cores usable (2 cores less 1 for the server)"
    )


def test_describe(cores) -> None:
    cores(32)
    w = WorkloadConfig(name="chat", arrival=ArrivalConfig(concurrency=256))
    assert choose_client(w, EngineConfig(), specs(300)).describe() == (
        "16 processes (auto), 256 requests in flight: at most 16 streams each "
        "(16 here; 31 cores usable)"
    )
    small = replace(w, arrival=ArrivalConfig(concurrency=4))
    assert choose_client(small, EngineConfig(), specs(300)).describe() == (
        "1 process, the tuner's own (auto), 4 requests in flight: up to 8 stay in it"
    )
    fixed = replace(w, arrival=ArrivalConfig(concurrency=1000), client_processes=2)
    assert choose_client(fixed, EngineConfig(), specs(3000)).describe() == (
        "2 processes (workload.client_processes=2), 1000 requests in flight (500 per process)"
    )


# --- the config knob ----------------------------------------------------------------------------


def test_config_accepts_auto_and_counts(make_cfg) -> None:
    assert make_cfg("+workload=chat").workload.client_processes == "auto"
    cfg = make_cfg("+workload=chat", "workload.client_processes=auto")
    assert cfg.workload.client_processes == "auto"
    n = min(2, usable_cores())
    cfg = make_cfg("+workload=chat", f"workload.client_processes={n}")
    assert cfg.workload.client_processes == n


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("0", r"^workload.client_processes is 0; allowed: auto, or 1 to \d+ \(the CPU cores"),
        ("100000", r"^workload.client_processes is 100000; allowed: auto, or 1 to \d+"),
        ("many", r"^workload.client_processes is 'many'; allowed: auto, or 1 to \d+"),
        ("'4'", r"^workload.client_processes is '4'; allowed: auto, or 1 to \d+"),
        ("2.5", r"workload.client_processes"),
        ("true", r"workload.client_processes"),
    ],
)
def test_config_rejects_bad_values_in_one_line(make_cfg, value: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as err:
        make_cfg("+workload=chat", f"workload.client_processes={value}")
    assert "\n" not in str(err.value)


# --- what the dry run and a late client say -----------------------------------------------------


def plan_text(cfg) -> str:
    buf = io.StringIO()
    print_plan(cfg, Console(file=buf, width=400))
    return buf.getvalue()


def test_dry_run_says_what_auto_chose_and_why(make_cfg, cores) -> None:
    cfg = make_cfg("+workload=chat", "study.precheck=false")
    cores(32)
    out = plan_text(cfg)
    assert (
        "replay client on asyncio: 4 processes (auto), 64 requests in flight: at most 16 "
        "streams each (16 here; 31 cores usable)\n"
        "  closed loop, 64 requests in flight\n"
        "  auto chooses again for each replay's own load (capacity steps, confirm runs); at the "
        "confirm stage's 2x: 8 processes (auto), 128 requests in flight: at most 16 streams "
        "each (16 here; 31 cores usable)\n"
    ) in out
    assert "note:" not in out
    cores(2)
    out = plan_text(cfg)
    assert "replay client on asyncio: 1 process, the tuner's own (auto): 64 requests" in out
    assert (
        "note: 64 streams in the tuner's own process: the client adds latency of its own at "
        "p99 above 16 streams a process, 8 in the tuner's own"
    ) in out
    assert "auto would take 4 processes given the cores" in out


def test_dry_run_of_a_fixed_count(make_cfg, cores) -> None:
    cores(32)
    n = min(2, usable_cores())
    cfg = make_cfg(
        "+workload=chat",
        "study.precheck=false",
        "workload.arrival.concurrency=200",
        f"workload.client_processes={n}",
    )
    out = plan_text(cfg)
    assert f"replay client on asyncio: {n} process" in out
    assert "auto chooses again" not in out
    where = "in the tuner's own process" if n == 1 else "per client process"
    assert f"note: {math.ceil(200 / n)} streams {where}: the client adds latency" in out
    assert "auto would take 13 processes given the cores" in out


def test_a_late_client_names_what_held_auto(caplog: pytest.LogCaptureFixture, cores) -> None:
    caplog.set_level(logging.WARNING, logger="tuner")
    w = WorkloadConfig(name="chat", arrival=ArrivalConfig(concurrency=256))
    late = {"client_lag_p99_ms": 9.0, "client_lag_max_ms": 20.0, "client_cpu_max": 0.5}
    pinned = EngineConfig(cpu_pinning=True, cpu_reserve=2)
    cores(32)
    warn_client_lag(late, choose_client(w, pinned, specs(300)), "uvloop")
    warn_client_lag(late, choose_client(w, EngineConfig(), specs(300)), "uvloop")
    fixed = replace(w, client_processes=1)
    warn_client_lag(late, choose_client(fixed, EngineConfig(), specs(300)), "asyncio")
    held, free, one = (r.getMessage() for r in caplog.records)
    assert held.endswith(
        "auto was held to 2 client process(es) by the cores usable (engine.cpu_reserve=2 under "
        "engine.cpu_pinning); it would take 16, one per 16 requests in flight: give the client "
        "more cores"
    )
    assert free.endswith(
        "auto chose 16 client process(es) for 256 in flight; set workload.client_processes "
        "higher (up to 31 here)"
    )
    assert one.endswith(
        "raise workload.client_processes (now 1) or try workload.client_loop=uvloop"
    )


def test_the_study_warns_when_the_reserve_holds_auto(make_cfg, caplog, cores) -> None:
    from tuner.measure import note_client_cores

    caplog.set_level(logging.INFO, logger="tuner")
    cfg = make_cfg("+workload=chat")
    cfg = replace(cfg, engine=replace(cfg.engine, cpu_pinning=True, cpu_reserve=2))
    cores(2)  # the tuner's process on its 2 reserved cores
    light = replace(cfg, workload=replace(cfg.workload, arrival=ArrivalConfig(concurrency=32)))
    note_client_cores(light, [0, 1], {0: [2, 3]}, specs(300))  # 32 in flight: 2, no warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    busy = replace(cfg, workload=replace(cfg.workload, arrival=ArrivalConfig(concurrency=256)))
    note_client_cores(busy, [0, 1], {0: [2, 3]}, specs(300))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning == (
        "workload.client_processes=auto: the workload's 256 requests in flight call for 16 client "
        "processes (at most 16 streams each) but engine.cpu_reserve=2 holds it to 2: raise "
        "engine.cpu_reserve to 16 or more"
    )


def test_lag_warnings_say_what_the_lag_weighs_in_the_simulators_modelled_time(
    caplog: pytest.LogCaptureFixture, cores
) -> None:
    # the simulator's latencies are its modelled GPU's, speed-up times the wall's: 11.2 ms of
    # wall lag at speed-up 6 is 67 ms of modelled TTFT (a quick start on 2 cores, 2026-12-05)
    from tuner.measure import warn_sim_lag

    caplog.set_level(logging.WARNING, logger="tuner")
    w = WorkloadConfig(name="chat", arrival=ArrivalConfig(concurrency=256))
    late = {"client_lag_p99_ms": 9.0, "client_lag_max_ms": 20.0, "client_cpu_max": 0.5}
    cores(2)
    warn_client_lag(late, choose_client(w, EngineConfig(), specs(300)), "uvloop", 6.0)
    warn_client_lag(late, choose_client(w, EngineConfig(), specs(300)), "uvloop")
    warn_sim_lag({"sim_lag_mean_ms": 11.2}, 6.0)
    warn_sim_lag({"sim_lag_mean_ms": 11.2})
    warn_sim_lag({"sim_lag_mean_ms": 1.0}, 6.0)  # below the threshold: nothing
    client_sim, client_gpu, sim, sim_1 = (r.getMessage() for r in caplog.records)
    assert "include up to 54 ms in the modelled GPU's time (×6) of the client's" in client_sim
    assert "include up to that much of the client's own delay" in client_gpu
    assert "include 67 ms in the modelled GPU's time (×6) of the host's CPU" in sim
    assert "include that much of the host's CPU" in sim_1
