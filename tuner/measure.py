"""Stage 4, the measurement: one request stream replayed on a ready server, with the server's
``/metrics`` and the GPU sampled beside it, stopped early (pruned) once a constraint is lost
beyond doubt.

:func:`measure` returns the request records, the telemetry summary (server, GPU and the replay
client's own cost) and the prune reason; it writes ``metrics.jsonl`` and ``gpu.jsonl`` into the
replay's folder. The trial (:mod:`tuner.trial`) turns that into a result. The replay client's
processes are chosen for this replay's own load (:func:`tuner.replay.choose_client`) and recorded
as ``client_processes`` beside its lag.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import aiohttp

import tuner.replay as replay_mod
from tuner.aio import cancel_and_wait
from tuner.artifacts import TrialFolder, make_dir, write_jsonl
from tuner.config import ObjectiveConfig, TunerConfig, WorkloadConfig
from tuner.engine.argv import api_key
from tuner.engine.clock import Clock
from tuner.engine.pool import describe_cores
from tuner.records import RequestRecord, RequestSpec
from tuner.replay import STREAMS_PER_PROCESS, ClientChoice, choose_client, is_closed_loop, replay
from tuner.replay_client import ClientStats
from tuner.score import PruneWatch, Sends
from tuner.telemetry.gpu import GpuSampler
from tuner.telemetry.prom import MetricsScraper

__all__ = [
    "Measured",
    "Replay",
    "measure",
    "unsteady_indices",
    "note_client_cores",
    "reset_caches",
    "warn_client_lag",
    "warn_sim_lag",
]

log = logging.getLogger("tuner")

SEND_SLACK_WALL_S = 0.1
"""How long after a request came back its closed-loop slot's next request may still be sent, in
wall-clock seconds (:class:`tuner.score.Sends`): a slot stamps its next request's send time in
the same turn of the client's event loop as it hands the last one's record on, and that loop ran
at most 1.6-2.8 ms late at p99 on the H100 on 2026-12-06
(docs/gpu-runs/2026-12-06-tpot15-h100.md)."""


@dataclass(frozen=True)
class Replay:
    """One request stream replayed on a launched server; its artifacts go to ``subdir``."""

    subdir: str
    requests: list[RequestSpec]
    workload: WorkloadConfig
    steady: bool = False
    """Count only its steady state: a closed loop's start and end are sent but not counted
    (:func:`unsteady_indices`); the capacity search's steps."""

    @cached_property
    def unsteady(self) -> frozenset[int]:
        """:func:`unsteady_indices`, computed once: for the pruning watch (where ``steady``) and
        for the capacity step's metrics (every step, the workload's own replay included)."""
        return unsteady_indices(self)


def unsteady_indices(rp: Replay) -> frozenset[int]:
    """A closed loop's requests outside its steady state: the first ``concurrency`` measured
    ones, which it sends all at once (their prefills queue behind each other, a burst no steady
    load has), and the last ``concurrency``, which run while the loop drains (ever fewer in
    flight). On the H200 the chat steps near capacity failed on p95 TTFT with 43-54 requests of
    828-1,047 over the SLO, about what the start's tail makes, so the capacity depended on the
    replay's length (docs/gpu-runs/2026-12-02-levers-chat.md). At most a third of the replay at
    each end (a replay shorter than 3 per slot keeps its middle third); empty for an open loop."""
    if not is_closed_loop(rp.workload.arrival, rp.requests):
        return frozenset()
    measured = sorted(s.index for s in rp.requests if not s.warmup)
    k = min(rp.workload.arrival.concurrency, len(measured) // 3)
    return frozenset(measured[:k]) | frozenset(measured[len(measured) - k :]) if k else frozenset()


@dataclass(frozen=True)
class Measured:
    """What one replay measured: its records, the telemetry summary, and the prune reason."""

    records: list[RequestRecord]
    telemetry: dict[str, float]
    pruned: str | None


async def measure(
    cfg: TunerConfig,
    base_url: str,
    tdir: Path,
    gpus: list[int],
    rp: Replay,
    prune: ObjectiveConfig | None,
    served_at_most: float | None = None,
) -> Measured:
    """Replay with telemetry beside it; stop early (pruned) once a constraint of ``prune`` is
    lost (None: never) and, given ``served_at_most`` (a closed loop's), once it cannot serve
    more requests/s than that (:class:`tuner.score.PruneWatch`). ``cfg`` gives the engine and
    the model, not the objective. The replay runs on the engine's clock
    (:class:`tuner.engine.clock.Clock`): the records come back in the engine's own seconds, the
    modelled GPU's on the simulator."""
    w = rp.workload
    clock = Clock.of(cfg.engine)
    wall_requests = clock.wall_requests(rp.requests)
    make_dir(tdir)
    total = len(rp.requests)
    skip = rp.unsteady if rp.steady else frozenset()
    order = [r.index for r in rp.requests if not r.warmup]  # the measured ones, as sent
    n_measured = len(order) - len(skip)
    step = max(1, total // 4)
    done: list[RequestRecord] = []
    lost = asyncio.Event()
    why: list[str] = []
    at_most = None if served_at_most is None else (w.arrival.concurrency, served_at_most)
    sends = (
        Sends(order, w.duration_s, SEND_SLACK_WALL_S * clock.speedup)
        if at_most is not None and skip
        else None
    )
    pruner = None if prune is None else PruneWatch(n_measured, prune, w.slo, skip, at_most, sends)
    # a steady replay ends once its counted requests have all finished: the drain's requests
    # still in flight then change nothing counted (they kept the load up until the last counted
    # one finished), so they are cancelled instead of waited for
    counted = set(order) - skip if skip else set()
    measured_all = asyncio.Event()

    def on_record(wall: RequestRecord) -> None:
        r = clock.modelled(wall)
        done.append(r)
        if len(done) % step == 0 and len(done) < total:
            log.info("  replay %d/%d requests", len(done), total)
        if counted:
            counted.discard(r.index)
            if not counted:
                measured_all.set()
        if pruner is not None and not lost.is_set():
            now_s = (time.perf_counter() - started[0]) * clock.speedup if started else None
            reason = pruner.add(r, now_s)
            if reason:
                why.append(reason)
                lost.set()

    client = ClientStats()
    started: list[float] = []  # the measured requests' start, perf_counter seconds
    choice = choose_client(w, cfg.engine, wall_requests)  # this replay's load, on these cores
    if choice.processes > 1:
        log.info("  replay client: %s", choice.describe())
    with GpuSampler(gpus if cfg.engine.kind == "vllm" else [], 0.5) as gpu:
        async with MetricsScraper(base_url, interval_s=1.0) as prom:
            task = asyncio.create_task(
                replay(
                    base_url,
                    cfg.model.served_name,
                    wall_requests,
                    w.arrival,
                    duration_s=clock.wall_s(w.duration_s),
                    request_timeout_s=clock.wall_s(w.request_timeout_s),
                    api_key=api_key(cfg.engine, cfg.model),
                    on_record=on_record,
                    processes=choice.processes,
                    client_loop=w.client_loop,
                    stats=client,
                    on_start=started.append,
                )
            )
            watch = asyncio.create_task(lost.wait())
            enough = asyncio.create_task(measured_all.wait())
            await asyncio.wait({task, watch, enough}, return_when=asyncio.FIRST_COMPLETED)
            watch.cancel()
            enough.cancel()
            pruned = None
            if task.done():
                records = [clock.modelled(r) for r in task.result()]
            elif lost.is_set():  # pruned: keep what finished, drop what was in flight
                await cancel_and_wait(task)
                records = list(done)
                pruned = why[0]
                log.info("  pruned after %d requests: %s", len(records), pruned)
            else:  # every counted request finished: the drain is not waited for
                await cancel_and_wait(task)
                records = list(done)
                log.info(
                    "  steady state measured: %d of the drain's requests cancelled or not sent",
                    total - len(records),
                )
    folder = TrialFolder(tdir)
    write_jsonl(folder.metrics, prom.samples)
    write_jsonl(folder.gpu, gpu.samples)
    own = {**client.summary(), "client_processes": float(choice.processes)}
    warn_client_lag(own, choice, w.client_loop, clock.speedup)
    server = prom.summary()
    warn_sim_lag(server, clock.speedup)
    stalls = stalls_while_counted(records, skip, started, clock, client, prom)
    return Measured(records, {**server, **gpu.summary(), **own, **stalls}, pruned)


def stalls_while_counted(
    records: list[RequestRecord],
    skip: frozenset[int],
    started: list[float],
    clock: Clock,
    client: ClientStats,
    prom: MetricsScraper,
) -> dict[str, float]:
    """The measuring side's longest stall while the counted requests ran, ms: the replay
    client's event loop (``client_stall_ms``) and, on the simulator, its latest stream chunk
    (``sim_stall_ms``). The counted requests are the measured ones less ``skip`` (a closed
    loop's start and drain, :func:`unsteady_indices`); their span runs from the first one's send
    to the last one's end, in wall time. The start is left out on purpose: there a closed loop
    sends every slot at once, and on 2 cores at ~460 in flight the simulator then ran 300-520 ms
    behind, every time, in the first second of a step, and 5-40 ms after it (the quick start
    under ``objective=capacity``, 2026-12-04); replaying those steps moved their margins by
    less than the replays' own sampling (34 steps). Absent keys: no counted request ended, or
    nothing sampled in that span."""
    ended = [r for r in records if not r.warmup and r.e2e_s is not None]
    counted = [r for r in ended if r.index not in skip] or ended
    if not started or not counted:
        return {}
    t0 = started[0]
    a = t0 + clock.wall_s(min(r.t_sent_s for r in counted))
    b = t0 + clock.wall_s(max(r.t_sent_s + (r.e2e_s or 0.0) for r in counted))
    out: dict[str, float] = {}
    if (lag := client.max_within(a, b)) is not None:
        out["client_stall_ms"] = lag
    if (peak := prom.peak_within("tuner_sim:stream_lag_max_seconds", a, b)) is not None:
        out["sim_stall_ms"] = 1e3 * peak
    return out


def note_client_cores(
    cfg: TunerConfig,
    cores: list[int],
    servers: dict[int, list[int]],
    requests: list[RequestSpec],
) -> None:
    """``engine.cpu_pinning``: say where the tuner and the servers run; warn when the replay
    client has more processes than the cores kept for it, or when those cores hold ``auto`` to
    fewer processes than the workload's own load calls for."""
    log.info("engine.cpu_pinning: %s", describe_cores(cores, servers))
    procs = cfg.workload.client_processes
    if isinstance(procs, int) and procs > len(cores):
        log.warning(
            "workload.client_processes=%d shares engine.cpu_reserve=%d cores with the tuner: "
            "raise engine.cpu_reserve to %d or more so each client process has a core",
            procs,
            len(cores),
            procs + 1,
        )
    choice = choose_client(cfg.workload, cfg.engine, requests)
    if choice.held:
        log.warning(
            "workload.client_processes=auto: the workload's %d requests in flight call for %d "
            "client processes (at most %d streams each) but engine.cpu_reserve=%d holds it to %d: "
            "raise engine.cpu_reserve to %d or more",
            choice.in_flight,
            choice.wanted,
            STREAMS_PER_PROCESS,
            cfg.engine.cpu_reserve,
            choice.processes,
            choice.wanted,
        )


def _modelled(lag_ms: float, speedup: float) -> str:
    """How much a wall-clock delay weighs in the latencies measured: on the simulator they are
    the modelled GPU's, ``speedup`` times the wall's (:mod:`tuner.engine.clock`)."""
    if speedup == 1.0:
        return "that much"
    return f"{lag_ms * speedup:.0f} ms in the modelled GPU's time (×{speedup:g})"


def warn_client_lag(
    own: dict[str, float], choice: ClientChoice, client_loop: str, speedup: float = 1.0
) -> None:
    """Warn when the replay client's event loop ran late enough to show in TTFT/ITL."""
    lag = own.get("client_lag_p99_ms")
    if lag is None or lag <= replay_mod.CLIENT_LAG_WARN_MS:  # read at call time: tests lower it
        return
    hint = choice.hint()
    if client_loop == "asyncio":
        hint += " or try workload.client_loop=uvloop"
    log.warning(
        "  the replay client was busy: its event loop ran %.1f ms late at p99 (max %.1f ms, "
        "busiest client process at %.0f%% CPU), so TTFT/ITL include up to %s of the client's "
        "own delay; %s",
        lag,
        own.get("client_lag_max_ms", lag),
        100 * own.get("client_cpu_max", 0.0),
        _modelled(lag, speedup),
        hint,
    )


def warn_sim_lag(server: dict[str, float], speedup: float = 1.0) -> None:
    """Warn when the simulated engine's stream chunks left later than its model said (its
    ``tuner_sim:stream_lag_seconds``): the host's CPU, not the modelled GPU, then shows in the
    latencies measured, ``speedup`` times over. The threshold is the client's
    (:data:`tuner.replay.CLIENT_LAG_WARN_MS`)."""
    lag = server.get("sim_lag_mean_ms")
    if lag is None or lag <= replay_mod.CLIENT_LAG_WARN_MS:
        return
    log.warning(
        "  the simulated engine fell behind its model: its tokens left %.1f ms late on average "
        "(its server.log has the p99), so the latencies measured include %s of the host's "
        "CPU; lower engine.env.TUNER_SIM_SPEEDUP or give it a core",
        lag,
        _modelled(lag, speedup),
    )


async def reset_caches(base_url: str, key: str | None) -> bool:
    """POST vLLM's ``/reset_prefix_cache`` and ``/reset_mm_cache`` (mounted only when the server
    runs with ``VLLM_SERVER_DEV_MODE=1``); True if both answered 200."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    ok = True
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for path in ("/reset_prefix_cache", "/reset_mm_cache"):
            try:
                async with http.post(base_url + path, headers=headers) as resp:
                    ok = ok and resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
    if not ok:
        log.info("  caches not reset (the server needs VLLM_SERVER_DEV_MODE=1 for that)")
    return ok
