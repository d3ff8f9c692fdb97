"""The capacity search on a trial's server: each load factor :func:`tuner.capacity.search` asks
for is the workload at that load (:func:`tuner.workload.at_load`) replayed into ``capacity_K/``
by the ``measure`` it is given, after a cache reset, followed by a health ``check``; the answer
goes to ``capacity.json``. A step's :func:`margin`: the least headroom to the SLOs
(:func:`tuner.score.slo_margins`) and to the error budget. It knows nothing of the trial.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from tuner.artifacts import TrialFolder, write_json, write_requests
from tuner.capacity import Capacity, Start, Step, search, start_factor, unsettled
from tuner.config import ObjectiveConfig, SLOConfig, WorkloadConfig
from tuner.measure import Measured, Replay, reset_caches, unsteady_indices
from tuner.records import RequestSpec
from tuner.replay import is_closed_loop
from tuner.score import KEY_METRICS, slo_margins, summarize
from tuner.telemetry.prom import wait_idle
from tuner.workload import Mix, at_load, build_requests, request_mix

__all__ = [
    "CLOSED_LOOP_REQUESTS_PER_SLOT",
    "MAX_REPEATS",
    "MIN_STEP_REQUESTS",
    "OWN_REPLAY_LOST",
    "Measure",
    "counted_mix",
    "holds",
    "margin",
    "probe_capacity",
    "stall_of",
    "step_of",
    "step_replay",
    "step_requests",
    "step_size",
    "step_workload",
    "whole_load",
]

log = logging.getLogger("tuner")

MIN_STEP_REQUESTS = 100
"""A capacity step measures at least this many requests: a p95 of fewer moves too much between
identical runs to say on which side of an SLO a load lies."""
CLOSED_LOOP_REQUESTS_PER_SLOT = 3
"""A capacity step of a closed loop sends at least this many requests per slot in flight: the
first of each slot start at once and the last run while the loop drains, both sent but not
counted (:func:`tuner.measure.unsteady_indices`), so at least one per slot is measured."""

HOST_LAG = (
    "client_lag_p99_ms",
    "client_lag_max_ms",
    "client_stall_ms",
    "sim_lag_mean_ms",
    "sim_lag_max_ms",
    "sim_stall_ms",
)
"""How late the replay client's event loop (p99, max, and the max while the counted requests
ran) and the simulator's stream chunks (mean, max, the max while counted) ran during a step,
kept in its row: the host's CPU, not the server, in what was measured."""
MAX_REPEATS = 2
"""Steps a search replays at most because the measuring side stalled (``stall_ms``)."""
OWN_REPLAY_LOST = "the workload's own replay lost"
"""Why a search measured its first load again (``capacity.json``'s ``repeated``): the workload's
own replay, the search's first step, is not a step's measure. It runs right after start-up, with
the workload's requests (long_docs: 40, 14 of them counted; a step counts at least
:data:`MIN_STEP_REQUESTS`), and the closed loop's start, all slots at once, still reaches its
counted span. Its p95 TTFT read 9.6 s where the steps above its load read 1.8-2.0 s (long_docs,
SLO 10 s, H100, docs/gpu-runs/2026-12-06-long-docs-kv-h100-4.md), and on the simulator 1.0-1.1 s
where a step at 0.91x read 0.45 s. Of 321 searches in 16 quick starts (2026-12-06, 2 cores), 7
lost there, each on TTFT p95 (2.1-2.7 s, SLO 2 s); for one, vLLM's defaults, that loss put the
capacity at 51.4 req/s against its other servers' 68.2 and 68.5. A loss there is therefore
measured again as a step at the same load, and the search goes on from that step."""

Measure = Callable[[Path, Replay, ObjectiveConfig, float | None], Awaitable[Measured]]
"""Replays on the trial's server into a folder, pruned by the objective's constraints (a closed
loop's, given a rate, only once it cannot serve more: :func:`tuner.measure.measure`)."""


def margin(metrics: Mapping[str, float], objective: ObjectiveConfig, slo: SLOConfig) -> float:
    """The smallest relative headroom to the SLOs (a metric without samples: -1) and to the
    error budget; < 0: not held."""
    room = [-1.0 if r is None else r for r in slo_margins(metrics, objective, slo).values()]
    err = float(metrics.get("error_rate", 1.0))
    budget = objective.max_error_rate
    room.append(1.0 - err / budget if budget > 0 else (0.0 if err <= 0 else -1.0))
    return min(room)


def holds(metrics: Mapping[str, float], objective: ObjectiveConfig, slo: SLOConfig) -> bool:
    return margin(metrics, objective, slo) >= 0.0


async def probe_capacity(
    number: int,
    objective: ObjectiveConfig,
    base: Replay,
    first: Measured,
    *,
    base_url: str,
    folder: TrialFolder,
    model_files: Path,
    api_key: str | None,
    measure: Measure,
    check: Callable[[], Awaitable[None]],
    start: Start | None = None,
    stop_on_loss: bool = False,
) -> Capacity:
    """The SLO capacity of trial ``number``'s server, from ``base`` (the workload's own replay,
    measured as ``first``) on: each further step replayed by ``measure`` into
    ``folder``'s ``capacity_K/``, the server's health ``check``-ed after each (its exception
    ends the search); the answer and the steps written to ``folder.capacity``. ``start``: the
    load factor tried next (the study's incumbent capacity, or a confirmed pick's own);
    ``stop_on_loss``: a loss there ends the search, censored above
    (:func:`tuner.capacity.search`)."""
    # each step judged on every SLO (whatever objective.slo_constraints says), pruned when lost;
    # a closed loop's step at or below the incumbent's load replayed until its served rate, which
    # decides whether a loss there ends the search (capacity.search's ``closed``), is known to be
    # at most the incumbent's or the step ends
    judged = replace(objective, slo_constraints=True, prune=True)
    closed = _closed(base)
    incumbent_at = (  # the incumbent's load: a loss at or below it decides by its served rate
        start_factor(start, objective.capacity)
        if closed and stop_on_loss and start is not None and start.binding
        else None
    )
    at_incumbent: list[Step] = []  # the step(s) at the incumbent's load (a stall repeats one)
    numbers = itertools.count(1)  # the capacity_K folders; step 0 is the workload's own replay
    repeated: list[dict[str, Any]] = []  # steps a stall of the measuring side voided

    def voided(step: Step, subdir: str) -> bool:
        """Whether ``step`` ran while the replay client or the simulator stalled (the host, not
        the server): it is then replayed once, at most :data:`MAX_REPEATS` in a search."""
        stall, who = stall_of(step.metrics)
        limit = objective.capacity.stall_ms
        stalls = sum(1 for r in repeated if "why" not in r)  # not the own replay measured again
        if not limit or stall < limit or stalls >= MAX_REPEATS:
            return False
        repeated.append({**step.row(), "replay": subdir or ".", "stall_ms": stall})
        log.warning(
            "trial %d: %s stalled %.0f ms during the capacity step at %.3gx the workload's "
            "load (objective.capacity.stall_ms %g): the host, not the server; replaying it once",
            number, who, stall, step.factor, limit,
        )  # fmt: skip
        return True

    async def probe(factor: float) -> Step:
        step, subdir = await replay_at(factor)
        if voided(step, subdir):
            step, _ = await replay_at(factor)
        return step

    async def replay_at(factor: float) -> tuple[Step, str]:
        k = next(numbers)
        rp = await asyncio.to_thread(
            step_replay, objective, base, factor, model_files, f"capacity_{k}"
        )
        w = rp.workload
        if not await wait_idle(base_url):  # a step stopped early left requests running
            log.warning("trial %d: the server was still busy 120 s after a replay", number)
        await reset_caches(base_url, api_key)
        log.info(
            "trial %d: capacity step %d at %.3gx the workload's load%s",
            number,
            k + 1,
            factor,
            f" ({w.arrival.concurrency} in flight)" if _closed(rp) else "",
        )
        step_dir = folder.replay(rp.subdir).path
        decides = factor == incumbent_at  # never, without a binding start
        m = await measure(step_dir, rp, judged, served_at_most(incumbent_at, start, factor))
        await check()  # the engine died: its exception ends the search
        write_requests(step_dir, m.records)
        step = step_of(_factor(base, rp, factor), rp, m, judged)
        if decides:
            at_incumbent.append(step)
        return step, rp.subdir

    first_step = step_of(1.0, base, first, judged)
    if voided(first_step, base.subdir):  # the workload's own replay, at its own load
        first_step, _ = await replay_at(1.0)
    elif not first_step.held and not base.steady:
        # measured as no step is (right after start-up, fewer requests, a steady span that the
        # closed loop's start still reaches): a loss there is measured again as a step before
        # the search takes it (:data:`OWN_REPLAY_LOST`), as any step is: a stall of the
        # measuring side there voids it too
        repeated.append({**first_step.row(), "replay": base.subdir or ".", "why": OWN_REPLAY_LOST})
        log.info(
            "trial %d: lost at the workload's own load in its own replay (margin %+.3f): "
            "measured again there as a capacity step before the search takes it",
            number, first_step.margin,
        )  # fmt: skip
        first_step = await probe(1.0)

    def said(_: float) -> None:  # only where the start is replayed: not past a loss below it
        assert start is not None
        log.info(
            "trial %d: capacity probe at %.3gx the workload's load first%s",
            number,
            start.factor,
            "" if start.binding else " (a prediction: a loss there caps nothing)",
        )

    cap = await search(
        probe,
        objective.capacity,
        first=first_step,
        loads=functools.partial(whole_load, base),
        start=start,
        stop_on_loss=stop_on_loss,
        closed=closed,
        on_start=said,
    )
    if at_incumbent and not at_incumbent[-1].held and not cap.capped and start is not None:
        log.info(
            "trial %d: lost at the incumbent's load yet served %.2f req/s there, more than its "
            "%.2f: its capacity is measured below that load, not capped",
            number, at_incumbent[-1].rps, start.rps or 0.0,
        )  # fmt: skip
    write_json(
        folder.capacity,
        {"capacity": cap.metrics(), "steps": [s.row() for s in cap.steps], "repeated": repeated},
    )
    wide = unsettled(cap, objective.capacity)
    log.info(
        "trial %d: SLO capacity %s req/s (bracket %.2f-%.2f req/s, %d replays%s)",
        number,
        f">= {cap.rps:.2f}"
        if cap.censored
        else f"< {cap.high:.2f}, ~{cap.rps:.2f}"
        if cap.capped
        else f"{cap.rps:.2f}",
        cap.low,
        cap.high,
        len(cap.steps),
        "" if wide is None else "; " + wide_note(wide, objective.capacity.rel_width),
    )
    return cap


def wide_note(wide: float, rel_width: float) -> str:
    """A search's bracket left ``wide`` (:func:`tuner.capacity_answer.unsettled`) against the
    ``rel_width`` asked, with a decimal below 10 %: a bracket 5.2 % wide against 5 % read
    "5% wide where ... asks 5%" with none.

    >>> wide_note(0.052, 0.05)
    '5.2% wide where objective.capacity.rel_width asks 5%: max_steps ran out'
    >>> wide_note(0.323, 0.05)
    '32% wide where objective.capacity.rel_width asks 5%: max_steps ran out'
    """
    shown = f"{wide:.1%}" if wide < 0.1 else f"{wide:.0%}"
    asked = f"{rel_width * 100:g}%"
    return f"{shown} wide where objective.capacity.rel_width asks {asked}: max_steps ran out"


def served_at_most(incumbent_at: float | None, start: Start | None, factor: float) -> float | None:
    """The rate a closed loop's step at ``factor`` is replayed until it may serve no more than,
    if lost (:func:`tuner.measure.measure`'s ``served_at_most``): the incumbent's capacity at or
    below its load ``incumbent_at`` (where a loss ends the search only if it served no more:
    :func:`tuner.capacity.search`'s ``closed``); None above it or without an incumbent to lose
    to (pruned as soon as lost).

    >>> [served_at_most(4.0, Start(4.0, 70.0), f) for f in (3.5, 4.0, 4.5)]
    [70.0, 70.0, None]
    >>> served_at_most(None, Start(4.0, 70.0), 3.5) is None
    True
    """
    if incumbent_at is None or start is None or factor > incumbent_at:
        return None
    return start.rps


def stall_of(metrics: Mapping[str, float]) -> tuple[float, str]:
    """The longest stall of the measuring side while a replay's counted requests ran, ms, and
    whose: the replay client's longest event-loop delay (``client_stall_ms``), or the
    simulator's latest stream chunk (``sim_stall_ms``: on the simulator the host's CPU is the
    measuring side too), both over the counted requests' span only
    (:func:`tuner.measure.stalls_while_counted`: a closed loop's start, unmeasured, is where a
    busy host runs late every time). A stall inflates the latencies measured (a step fails that
    would hold) and, in a closed loop, deflates the served rate (a step that holds reads a lower
    capacity: one that held at 2x the load through a 2 s stall of the simulator served 22.9
    req/s, against 40.7 without)."""
    client = float(metrics.get("client_stall_ms", 0.0))
    sim = float(metrics.get("sim_stall_ms", 0.0))
    return (client, "the replay client") if client >= sim else (sim, "the simulator")


def step_replay(
    objective: ObjectiveConfig, base: Replay, factor: float, model_files: Path, subdir: str
) -> Replay:
    """The capacity step at ``factor`` times ``base``'s load: its requests (at least
    :data:`MIN_STEP_REQUESTS` measured; a closed loop's start and end, not counted, come on
    top, and at least :data:`CLOSED_LOOP_REQUESTS_PER_SLOT` per slot in all), counted in their
    steady state."""
    closed = _closed(base)
    w = step_workload(objective, base.workload, factor, closed)
    return Replay(subdir, step_requests(w, model_files, closed), w, steady=True)


def step_workload(
    objective: ObjectiveConfig, w: WorkloadConfig, factor: float, closed: bool
) -> WorkloadConfig:
    """``w`` at ``factor`` × its load, with as many requests as a capacity step there sends
    (:func:`step_size`)."""
    ws = at_load(w, factor)
    return replace(ws, num_requests=step_size(objective, ws, closed))


def step_size(objective: ObjectiveConfig, w: WorkloadConfig, closed: bool) -> int:
    """The requests a capacity step at ``w``'s load sends (:func:`step_replay`)."""
    n = max(objective.capacity.requests or w.num_requests, MIN_STEP_REQUESTS)
    if closed:  # its start and end are not counted: 1 request per slot between, at least
        c = w.arrival.concurrency
        n = max(n + 2 * c, MIN_STEP_REQUESTS + 2 * c, CLOSED_LOOP_REQUESTS_PER_SLOT * c)
    return n


def whole_load(base: Replay, factor: float) -> float:
    """The load factor a step asked for at ``factor`` really runs at: a closed loop's
    concurrency is a whole number."""
    if not _closed(base):
        return factor
    c = base.workload.arrival.concurrency
    return at_load(base.workload, factor).arrival.concurrency / c


def step_requests(w: WorkloadConfig, model_files: Path, closed: bool) -> list[RequestSpec]:
    """A step's requests. A closed loop's are the first ``w.num_requests`` of the stream built at
    the next power of two: the steps of a search (and of the study's later trials) then replay
    the same requests at every load, and the stream is built once per size (the corpus caches its
    token windows: 0.1 s instead of 3 s for 2,000 requests on 2 cores). An open loop's arrival
    schedule depends on its length (a ramp spans it), so it is built at its own length."""
    if not closed:
        return build_requests(w, model_files)
    full = build_requests(replace(w, num_requests=_stream_size(w.num_requests)), model_files)
    warm = [s for s in full if s.warmup]
    return warm + [s for s in full if not s.warmup][: w.num_requests]


def counted_mix(
    objective: ObjectiveConfig, w: WorkloadConfig, factor: float
) -> tuple[Mix, list[int]]:
    """What a closed-loop capacity step at ``factor`` × ``w``'s load measures its requests/s on:
    its stream's lengths and images (:func:`tuner.workload.request_mix`, no texts built) and the
    indices it counts (:func:`tuner.measure.unsteady_indices`). For
    ``benchmarks/capacity_streams.py`` and the tests of the streams' stratification."""
    ws = step_workload(objective, w, factor, closed=True)
    n = ws.num_requests
    mix = request_mix(replace(ws, num_requests=_stream_size(n)))
    warm = max(0, ws.warmup_requests)
    specs = [RequestSpec(i, "chat", {}, 0, 0, warmup=i < warm) for i in range(warm + n)]
    skip = unsteady_indices(Replay("step", specs, ws))
    return mix, [s.index for s in specs if not s.warmup and s.index not in skip]


def _stream_size(n: int) -> int:
    """A closed-loop step of ``n`` requests takes the first ``n`` of the stream of this size."""
    return 1 << max(0, n - 1).bit_length()


def step_of(factor: float, rp: Replay, m: Measured, objective: ObjectiveConfig) -> Step:
    """One replay as a step of the capacity search: requests/s offered (open loop: from the
    send times) or served (closed loop: by Little's law, the slots in flight over the mean E2E
    latency, steadier than completions over a short replay's span with its ramp up and down),
    the SLO margin, held or not."""
    # a closed loop's start and end: capacity is the steady state's
    steady = [r for r in m.records if r.index not in rp.unsteady]
    metrics = {**m.telemetry, **summarize(steady, rp.workload.slo)}
    rps = float(metrics.get("request_throughput", 0.0))
    sends = sorted(r.arrival_s for r in rp.requests if not r.warmup and r.arrival_s is not None)
    if not _closed(rp) and len(sends) > 1 and sends[-1] > sends[0]:
        rps = (len(sends) - 1) / (sends[-1] - sends[0])
    elif _closed(rp) and metrics.get("e2e_mean_ms"):
        rps = rp.workload.arrival.concurrency / (metrics["e2e_mean_ms"] / 1000.0)
    mg = margin(metrics, objective, rp.workload.slo)
    if m.pruned:  # lost beyond doubt, whatever the finished part says
        mg = min(mg, -0.01)
    keep = {k: metrics[k] for k in (*KEY_METRICS, *HOST_LAG) if k in metrics}
    return Step(factor, rps, mg, mg >= 0, keep, m.pruned)


def _closed(rp: Replay) -> bool:
    return is_closed_loop(rp.workload.arrival, rp.requests)


def _factor(base: Replay, rp: Replay, asked: float) -> float:
    """The load factor a replay really ran at (a closed loop's concurrency is whole)."""
    if _closed(rp):
        return rp.workload.arrival.concurrency / base.workload.arrival.concurrency
    return asked
