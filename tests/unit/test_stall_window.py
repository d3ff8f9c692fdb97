"""A stall of the measuring side counts only while a replay's counted requests ran
(tuner.measure.stalls_while_counted): a closed loop's start, which it sends all at once and does
not count, is where a busy host runs late every time (on 2 cores at ~460 in flight the
simulator ran 300-520 ms behind in the first second of each step and 5-40 ms after it)."""

from __future__ import annotations

from typing import Any

from tuner.engine.clock import Clock
from tuner.measure import stalls_while_counted
from tuner.records import RequestRecord
from tuner.replay_client import ClientStats
from tuner.telemetry.prom import MetricsScraper

LAG = "tuner_sim:stream_lag_max_seconds"


def _scraper(t0: float, reads: list[tuple[float, float]]) -> MetricsScraper:
    """A scraper whose reads at ``t0 + t`` found the gauge at ``value`` s (the entry read
    first, at 0, as ``__aenter__`` takes it)."""
    s = MetricsScraper("http://127.0.0.1:9")
    s._t0 = t0  # noqa: SLF001  # the entry time, as __aenter__ sets it
    s.samples = [{"t_s": 0.0, LAG: 0.0}] + [{"t_s": t, LAG: v} for t, v in reads]
    return s


def _record(index: int, sent: float, e2e: float, **kw: Any) -> RequestRecord:
    return RequestRecord(index, "ok", sent, ttft_s=0.1, e2e_s=e2e, **kw)


def test_a_gauge_read_counts_where_its_span_overlaps_the_window() -> None:
    s = _scraper(100.0, [(1.0, 0.31), (2.0, 0.011), (3.0, 0.019), (4.0, 0.5)])
    # reads span (100, 101], (101, 102], (102, 103], (103, 104]
    assert s.peak_within(LAG, 101.5, 102.9) == 0.019  # spans 2 and 3
    assert s.peak_within(LAG, 100.0, 100.5) == 0.31
    assert s.peak_within(LAG, 103.5, 110.0) == 0.5
    assert s.peak_within(LAG, 104.5, 110.0) is None  # after the last read
    assert s.peak_within("vllm:num_requests_running", 100.0, 110.0) is None


def test_client_lag_within_a_window_across_processes() -> None:
    stats = ClientStats()
    stats.add([0.001, 0.150, 0.002], 0.1, 1.0, [10.0, 10.5, 11.0])
    stats.add([0.004, 0.003], 0.1, 1.0, [10.6, 11.2])
    stats.add([0.9], 0.1, 1.0)  # no times (an older child): never in a window
    assert stats.max_within(10.4, 10.6) == 150.0
    assert stats.max_within(10.8, 12.0) == 3.0
    assert stats.max_within(20.0, 21.0) is None
    assert stats.summary()["client_lag_max_ms"] == 900.0  # the whole replay's, as before


def test_the_closed_loops_start_is_left_out_and_a_stall_inside_counted() -> None:
    # 4 slots, 12 requests: 0-3 start at once (unsteady), 8-11 run while the loop drains
    # (unsteady); 4-7 are counted, sent at 1.0-1.6 s and ended by 2.5 s (modelled), at
    # speed-up 2: 0.5-1.25 s of wall time after the start at t0 = 50
    records = [_record(i, 0.0, 0.9) for i in range(4)]
    records += [_record(4 + i, 1.0 + 0.2 * i, 0.9) for i in range(4)]
    records += [_record(8 + i, 2.6, 0.9) for i in range(4)]
    records.append(_record(99, 0.0, 0.5, warmup=True))
    skip = frozenset({0, 1, 2, 3, 8, 9, 10, 11})
    clock = Clock(2.0)
    client = ClientStats()
    client.add([0.40, 0.002, 0.003, 0.25], 0.1, 2.0, [50.1, 50.6, 51.0, 51.9])
    prom = _scraper(49.9, [(0.3, 0.52), (0.8, 0.012), (1.4, 0.03), (2.1, 0.2)])
    # the start's 400 ms (client) and 520 ms (simulator) are before 50.5, the drain's 250 and 200
    # ms after 51.25 (the last read spans 51.3-52.0)
    got = stalls_while_counted(records, skip, [50.0], clock, client, prom)
    assert got == {"client_stall_ms": 3.0, "sim_stall_ms": 30.0}

    # a stall while counted requests ran is found
    prom = _scraper(49.9, [(0.3, 0.52), (0.8, 0.9), (1.3, 0.03)])
    assert stalls_while_counted(records, skip, [50.0], clock, client, prom)["sim_stall_ms"] == 900

    # an open loop (nothing skipped): every measured request counts, the warm-up does not
    got = stalls_while_counted(records, frozenset(), [50.0], clock, client, prom)
    assert got["client_stall_ms"] == 400.0

    assert stalls_while_counted(records, skip, [], clock, client, prom) == {}  # never started
