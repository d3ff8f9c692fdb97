from __future__ import annotations

import numpy as np
import pytest

from tuner.capacity_probe import holds, margin
from tuner.config import ObjectiveConfig, ObjectiveSpec, SLOConfig
from tuner.records import RequestRecord
from tuner.score import (
    constraints,
    failure_values,
    objective_values,
    prune_reason,
    slo_margins,
    summarize,
)


def throughput(
    *,
    slo_constraints: bool = True,
    prune: bool = True,
    max_error_rate: float = 0.05,
    slo_percentile: int = 95,
) -> ObjectiveConfig:
    """``objective=throughput``: tok/s against p95 TTFT, each SLO a constraint (the default,
    capacity, has none: it counts only loads that hold)."""
    return ObjectiveConfig(
        objectives=[
            ObjectiveSpec("output_throughput", "maximize"),
            ObjectiveSpec("ttft_p95_ms", "minimize"),
        ],
        slo_constraints=slo_constraints,
        prune=prune,
        max_error_rate=max_error_rate,
        slo_percentile=slo_percentile,
    )


def rec(i: int, t: float, ttft: float, e2e: float, out: int, **kw) -> RequestRecord:
    return RequestRecord(
        index=i,
        status=kw.pop("status", "ok"),
        t_sent_s=t,
        ttft_s=ttft,
        itl_s=kw.pop("itl", (0.01,)),
        e2e_s=e2e,
        prompt_tokens=100,
        output_tokens=out,
        **kw,
    )


def test_summary_matches_bench_serve_definitions() -> None:
    records = [
        rec(0, 0.0, 0.1, 1.1, 11),
        rec(1, 0.5, 0.3, 2.3, 21),
        rec(2, 1.0, 0.2, 1.0, 9, itl=(0.02, 0.04)),
        RequestRecord(index=3, status="error", t_sent_s=1.0, error="boom", http_status=500),
        rec(9, 0.0, 5.0, 9.0, 100, warmup=True),  # excluded
    ]
    m = summarize(records, SLOConfig(ttft_ms=250, tpot_ms=None))
    duration = 2.8  # first send 0.0 → last completion 0.5 + 2.3
    assert m["duration_s"] == pytest.approx(duration)
    assert m["output_throughput"] == pytest.approx(41 / duration)
    assert m["request_throughput"] == pytest.approx(3 / duration)
    assert m["success_rate"] == pytest.approx(0.75) and m["failed"] == 1
    assert m["ttft_p95_ms"] == pytest.approx(np.percentile([100, 300, 200], 95))
    assert m["tpot_mean_ms"] == pytest.approx(np.mean([100.0, 100.0, 100.0]))
    assert m["goodput"] == pytest.approx(2 / duration)  # the 300 ms TTFT misses the SLO
    assert m["itl_p50_ms"] == pytest.approx(np.percentile([10, 10, 20, 40], 50))


def test_no_success_gives_zero_throughput_and_worst_values() -> None:
    m = summarize([RequestRecord(index=0, status="timeout", t_sent_s=0.0)], SLOConfig())
    assert m["output_throughput"] == 0.0 and m["error_rate"] == 1.0
    obj = throughput()
    assert objective_values(m, obj) == (0.0, failure_values(obj)[1])


def test_constraints_per_failure_class_error_budget_and_slos() -> None:
    obj = throughput()
    slo = SLOConfig(ttft_ms=200, tpot_ms=50)
    ok = constraints({"error_rate": 0.0, "ttft_p95_ms": 100.0, "tpot_p95_ms": 60.0}, None, obj, slo)
    assert ok["error_rate"] == pytest.approx(-0.05)
    assert ok["slo_ttft"] == pytest.approx(-0.5)
    assert ok["slo_tpot"] == pytest.approx(0.2)  # p95 TPOT 60 ms over a 50 ms SLO
    assert "slo_e2e" not in ok
    assert all(ok[k] == 0.0 for k in ok if k.startswith("failed_"))
    bad = constraints({}, "kv_too_small", obj, slo)
    assert bad["failed_kv_too_small"] == 1.0
    assert sum(bad[k] for k in bad if k.startswith("failed_")) == 1.0
    assert bad["slo_ttft"] == 1.0 and bad["error_rate"] > 0
    assert set(ok) == set(bad)  # the same keys for every trial
    off = constraints({}, None, throughput(slo_constraints=False), slo)
    assert not [k for k in off if k.startswith("slo_")]


def test_prune_only_when_the_constraint_is_lost_for_sure() -> None:
    obj = throughput()  # p95, 5 % error budget
    slo = SLOConfig(ttft_ms=100)
    slow = [rec(i, 0.0, 0.5, 1.0, 10) for i in range(6)]
    # 100 requests: 5 may miss the p95 bound; 6 slow ones with one in hand is not yet certain
    assert prune_reason(slow, 100, obj, slo) is None
    assert "TTFT SLO" in (prune_reason([*slow, rec(6, 0.0, 0.5, 1.0, 10)], 100, obj, slo) or "")
    errors = [RequestRecord(index=i, status="error", t_sent_s=0.0) for i in range(6)]
    assert "failed" in (prune_reason(errors, 100, obj, slo) or "")
    assert prune_reason(errors, 100, throughput(prune=False), slo) is None
    fast = [rec(i, 0.0, 0.05, 1.0, 10) for i in range(50)]
    assert prune_reason(fast, 100, obj, slo) is None


def test_slo_margins_the_one_rule_of_an_slo_held() -> None:
    obj = throughput(max_error_rate=0.05, slo_percentile=95)
    slo = SLOConfig(ttft_ms=200, tpot_ms=50)
    some = {"ttft_p95_ms": 150.0, "ttft_p50_ms": 500.0, "error_rate": 0.0}
    assert slo_margins(some, obj, slo) == {"ttft": 0.25, "tpot": None}  # e2e: no SLO set
    # the constraints are its negation (a metric without samples, or a failure: violated) ...
    c = constraints(some, None, obj, slo)
    assert (c["slo_ttft"], c["slo_tpot"]) == (-0.25, 1.0) and "slo_e2e" not in c
    assert constraints(some, "crash", obj, slo)["slo_ttft"] == 1.0
    # ... the capacity search's margin its minimum, with the error budget
    assert margin(some, obj, slo) == -1.0 and not holds(some, obj, slo)
    both = {**some, "tpot_p95_ms": 40.0}
    assert margin(both, obj, slo) == pytest.approx(0.2) and holds(both, obj, slo)  # TPOT's
    assert margin({**both, "tpot_p95_ms": 60.0}, obj, slo) == pytest.approx(-0.2)
    assert margin({**both, "error_rate": 0.1}, obj, slo) == pytest.approx(-1.0)  # 2x the budget
    at_limit = {"ttft_p95_ms": 200.0, "tpot_p95_ms": 50.0, "error_rate": 0.0}
    assert slo_margins(at_limit, obj, slo) == {"ttft": 0.0, "tpot": 0.0}
    assert holds(at_limit, obj, slo)
    over = constraints(at_limit, None, obj, slo)["slo_ttft"]
    assert over == 0.0 and np.copysign(1.0, over) == 1.0  # not -0.0: met, as value/limit - 1


def test_a_closed_loops_start_and_drain_are_not_counted() -> None:
    # measure.unsteady_indices: the first and last `concurrency` measured requests of a closed
    # loop (at most a third of it at each end); PruneWatch and the capacity step skip them
    from dataclasses import replace

    from tuner.config import ArrivalConfig, WorkloadConfig
    from tuner.measure import Replay, unsteady_indices
    from tuner.records import RequestSpec
    from tuner.score import PruneWatch

    def specs(n: int, warm: int = 2, arrival: float | None = None) -> list[RequestSpec]:
        return [
            RequestSpec(i, "chat", {}, 10, 10, None if i < warm else arrival, warmup=i < warm)
            for i in range(warm + n)
        ]

    w = WorkloadConfig(arrival=ArrivalConfig(kind="concurrency", concurrency=4))
    assert unsteady_indices(Replay("r", specs(12), w)) == {2, 3, 4, 5, 10, 11, 12, 13}
    assert unsteady_indices(Replay("r", specs(6), w)) == {2, 3, 6, 7}  # a third at each end
    assert unsteady_indices(Replay("r", specs(2), w)) == frozenset()
    open_loop = replace(w, arrival=ArrivalConfig(kind="poisson", rate=4.0))
    assert unsteady_indices(Replay("r", specs(12, arrival=0.5), open_loop)) == frozenset()

    obj = ObjectiveConfig(slo_constraints=True, prune=True)
    slo = SLOConfig(ttft_ms=1000)
    watch = PruneWatch(10, obj, slo, skip=frozenset({0, 1, 2}))
    for i in range(3):  # the start's queued prefills: over the SLO, not counted
        assert watch.add(rec(i, 0.0, 5.0, 6.0, 10)) is None
    reasons = [watch.add(rec(i, 0.0, 5.0, 6.0, 10)) for i in range(3, 5)]
    assert reasons[0] is None and "TTFT SLO" in (reasons[1] or "")  # 2 > 5 % of 10 + 1


def test_a_lost_closed_loop_with_a_ceiling_stops_only_once_bound_to_serve_no_more() -> None:
    # the capacity probe's step at the incumbent's load (a closed loop): lost is not enough to
    # stop it; it must also be unable to serve more req/s than the incumbent (Little's law: in
    # flight over the counted requests' mean E2E, of which the finished ones' sum over all the
    # counted is a lower bound), or the step runs on and its full rate decides
    from tuner.score import PruneWatch

    obj = ObjectiveConfig(slo_constraints=True, prune=True)
    slo = SLOConfig(ttft_ms=1000)
    # 10 counted requests, 4 in flight, the incumbent at 2 req/s: stop once ΣE2E/10 >= 4/2 s
    watch = PruneWatch(10, obj, slo, served_at_most=(4, 2.0))
    plain = PruneWatch(10, obj, slo)
    reasons, plain_reasons = [], []
    for i in range(6):  # each 3 s long, over the TTFT SLO: lost after the second
        r = rec(i, 0.0, 2.0, 3.0, 10)
        reasons.append(watch.add(r))
        plain_reasons.append(plain.add(r))
    assert plain_reasons[0] is None and plain_reasons[1] is not None
    # ΣE2E after k records: 3k s; the bound 4 * 10 / 3k req/s is <= 2 from k = 7 on
    assert reasons == [None] * 6
    last = watch.add(rec(6, 0.0, 2.0, 3.0, 10))
    assert last is not None and "TTFT SLO" in last and "at most 1.905 req/s" in last
    # a failed request adds nothing to the bound; a record not counted (skip) neither
    cut = PruneWatch(10, obj, slo, skip=frozenset({0}), served_at_most=(4, 2.0))
    for i in range(7):
        assert cut.add(rec(i, 0.0, 2.0, 3.0, 10)) is None  # 6 counted: 18 s, bound 2.22 > 2
    assert cut.add(rec(7, 0.0, 2.0, 3.0, 10, status="error")) is None
    assert cut.add(rec(8, 0.0, 2.0, 3.0, 10)) is not None  # 21 s: 1.905
    # one that held is never stopped, however slow
    held = PruneWatch(10, obj, slo, served_at_most=(4, 2.0))
    assert all(held.add(rec(i, 0.0, 0.5, 30.0, 10)) is None for i in range(10))


def test_the_counted_requests_still_running_bound_the_rate_sooner() -> None:
    # a closed loop of 4 slots, 12 requests (0-3 its start, 8-11 its end, 4-7 counted), each
    # 6 s long and over the TTFT SLO; the incumbent at 1 req/s needs a mean E2E under 4 s, and
    # these serve 4 / 6 s: lost, and bound to serve no more, before most counted ones finish
    from tuner.score import PruneWatch, Sends

    obj = ObjectiveConfig(slo_constraints=True, prune=True)
    slo = SLOConfig(ttft_ms=1000)
    skip = frozenset({0, 1, 2, 3, 8, 9, 10, 11})
    sends = Sends(list(range(12)), 1e9, 0.01)

    def run(watch: PruneWatch, back: list[tuple[int, float]]) -> list[str | None]:
        return [watch.add(rec(i, t - 6.0, 2.0, 6.0, 10), now_s=t) for i, t in back]

    # the start's 4 come back at 6.0-6.3 s (4-7 sent then), 4-7 at 12.0-12.3 s
    back = [(0, 6.0), (1, 6.1), (2, 6.2), (3, 6.3), (4, 12.0), (5, 12.1), (6, 12.2), (7, 12.3)]
    plain = run(PruneWatch(4, obj, slo, skip, served_at_most=(4, 1.0)), back)
    # the finished ones alone: 6 + 6 < 4 x 4 s after two back, 18 after three
    assert plain[:6] == [None] * 6 and plain[6] is not None and "0.8889" in plain[6], plain
    got = run(PruneWatch(4, obj, slo, skip, served_at_most=(4, 1.0), sends=sends), back)
    # after two back (lost: both over the SLO), 6 and 7 have run 5.89 and 5.79 s (sent by
    # 6.21 and 6.31 s): each counts at most 4 s, 12 + 8 >= 16
    assert got[:5] == [None] * 5 and got[5] is not None and "at most 0.8 req/s" in got[5], got
    # without the replay's time, the finished ones alone bound it
    untimed = PruneWatch(4, obj, slo, skip, served_at_most=(4, 1.0), sends=sends)
    assert [untimed.add(rec(i, t - 6.0, 2.0, 6.0, 10)) for i, t in back] == plain


def test_running_requests_never_make_the_bound_unsound() -> None:
    # the rate is in flight over the mean E2E of the counted requests that end well: a running
    # request counts at most the mean the ceiling needs (one that fails later adds no more than
    # that), a send is not inferred past the replay's time, and a counted request back before
    # its send was inferred is not counted as running
    from tuner.score import PruneWatch, Sends

    obj = ObjectiveConfig(slo_constraints=True, prune=True)
    slo = SLOConfig(ttft_ms=1000)
    skip = frozenset({0, 1, 6, 7})

    def watch(until_s: float = 1e9) -> PruneWatch:
        sends = Sends(list(range(8)), until_s, 0.0)
        return PruneWatch(4, obj, slo, skip, (2, 1.0), sends)

    def start(w: PruneWatch) -> list[str | None]:
        # 2 slots, the incumbent at 1 req/s: a mean E2E of 2 s at least; 0 and 1 back at 1.0
        # and 1.1 s (2 and 3 sent), 2 and 3 back at 3.0 and 3.1 s (4 and 5 sent), over the SLO
        back = [(0, 0.0, 1.0), (1, 0.0, 1.1), (2, 1.0, 3.0), (3, 1.1, 3.1)]
        return [w.add(rec(i, t, 2.0, end - t, 10), now_s=end) for i, t, end in back]

    w = watch()
    assert start(w) == [None] * 4  # lost, but 2 + 2 + 0.1 + 0 < 4 x 2 s
    assert w.sent_by == {4: 3.0, 5: 3.1}
    # 100 s later 4 and 5 still run: they count 2 s each, 8 >= 8: at most 2 x 4 / 8 req/s
    got = w.reason(now_s=103.1)
    assert got is not None and "at most 1 req/s" in got, got
    assert w.reason(now_s=4.0) is None  # 4 + 1 + 0.9 < 8
    # past the replay's time nothing is sent: 4 and 5 do not run, and count nothing
    late = watch(until_s=2.5)
    assert start(late) == [None] * 4 and late.sent_by == {} and late.reason(now_s=103.1) is None
    # 2 and 3 back before 0 and 1 (another client process's records came first): the sends
    # their slots freed are 2 and 3 themselves, already ended; 0 and 1 free 4 and 5
    swapped = watch()
    for i, t, end in ((2, 0.5, 1.0), (3, 0.6, 1.1), (0, 0.0, 1.2), (1, 0.0, 1.3)):
        swapped.add(rec(i, t, 0.1, end - t, 10), now_s=end)
    assert swapped.sent_by == {4: 1.2, 5: 1.3}
