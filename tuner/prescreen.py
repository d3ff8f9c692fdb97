"""Prescreen: search the simulator's landscape before the real trials, launch its best first.

A real trial costs minutes of GPU time (a vLLM start-up alone took 115-170 s for Qwen3-8B on the
H200), so a sampler that learns the landscape from real trials spends most of a session's budget
on its start-up draws. With ``study.prescreen.trials`` > 0 the tuner first runs that many trials
of an in-memory Optuna study (TPE) on :func:`tuner.sim.landscape.evaluate` — the simulated engine,
calibrated to the H200 (``docs/sim-calibration.md``), in virtual time, in process (200 configs of
the long_docs profile at 32 in flight took 92 s on a 2-core CPU; chat configs take far less) —
with the same space, objectives, constraints, precheck and error budget as the real study.
Each config runs on two request streams (``workload.seed`` and ``+ 1``) and
counts with the worse of the two (as the confirm stage judges real runs), so the search favours
configs that win on any stream over ones that won one stream's draw. The ``study.prescreen.top``
best are enqueued ahead of the sampler's own draws, skipping configs the simulator measures alike
(every objective within 1 %: a change that does not bind, worth one launch at most). Each
enqueued trial carries the simulator's prediction (user attribute ``prescreen`` in the Optuna
storage), beside the metrics the trial then measures. The sampler of the real study then learns
from measurements as usual; the prescreen only chooses where the search starts.

Limits: the landscape replays closed loop (``workload.arrival.kind=concurrency``); it knows the
metrics of :data:`METRICS` (not E2E or ITL); its speed model was fitted on Qwen3-8B on one H200
(and checked on 86 H100 SXM servers) and is scaled for other shapes and TP
(``tuner.sim.engine.SpeedModel``), so elsewhere its ranking
is a guess to be checked by the real trials, which is what they do. Known blind spot: it has no
vision encoder (an image costs only its prompt tokens), so it ranks configs for image requests as
for text; on image_heavy it predicted fp8 weights +31.6 % where an H100 measured +0.6 %
(docs/sim-calibration.md). The prescreen says so when the workload has images.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import optuna

from tuner.capacity import Capacity, Start, Step, search
from tuner.capacity_probe import step_of, step_replay, whole_load
from tuner.config import TunerConfig
from tuner.errors import ConfigError, TrialFailed
from tuner.measure import Measured, Replay
from tuner.memory import GPU_PROFILES, GpuProfile, ModelShape
from tuner.precheck import gpu_of, passed_params, precheck
from tuner.records import RequestSpec
from tuner.score import (
    KEY_METRICS,
    constraints,
    failure_values,
    needs_capacity,
    objective_values,
)
from tuner.sim import IMAGES_BLIND_SPOT
from tuner.sim.landscape import LandscapeResult, PreparedStream, evaluate, prepare_stream, records
from tuner.space import defaults, distributions, resolved
from tuner.workload import build_requests

__all__ = ["METRICS", "Pick", "predict_capacity", "predict_start", "prescreen", "quiet_optuna"]

log = logging.getLogger("tuner")

METRICS = tuple(m for m in KEY_METRICS if not m.startswith("e2e_"))
"""Metrics the landscape measures (objectives and SLO constraints must use only these): the key
metrics but E2E."""

ALIKE = 0.01
"""Relative difference below which two configs' predicted objectives count as the same."""


@dataclass(frozen=True)
class Pick:
    """One config the prescreen enqueues, with the simulator's prediction for it."""

    params: dict[str, Any]
    """The searched params (the sampler's values; vLLM's defaults fill in the rest)."""
    predicted: dict[str, float]
    """Per objective metric the worse of the two streams, and each stream's (``_stream1``, ...)."""


def _metrics(r: LandscapeResult) -> dict[str, float]:
    total = r.completed + r.rejected
    return {
        "goodput": r.goodput,
        "output_throughput": r.output_throughput,
        "request_throughput": r.completed / r.duration_s if r.duration_s > 0 else 0.0,
        "ttft_p50_ms": r.ttft_p50_ms,
        "ttft_p95_ms": r.ttft_p95_ms,
        "tpot_p50_ms": r.tpot_p50_ms,
        "tpot_p95_ms": r.tpot_p95_ms,
        "error_rate": r.rejected / total if total else 1.0,
    }


def check(cfg: TunerConfig) -> None:
    """Raise ConfigError if the prescreen cannot model this study (before anything runs)."""
    p = cfg.study.prescreen
    if p.trials < 0 or p.top < 1:
        raise ConfigError(
            f"study.prescreen is trials={p.trials}, top={p.top}; allowed: trials >= 0 "
            "(0 = off) and top >= 1"
        )
    if not p.trials:
        return
    kind = cfg.workload.arrival.kind
    if kind != "concurrency":
        raise ConfigError(
            f"study.prescreen needs workload.arrival.kind=concurrency (the simulator's landscape "
            f"replays closed loop); this workload's is {kind!r}; set study.prescreen.trials=0"
        )
    if cfg.engine.gpu not in GPU_PROFILES:
        raise ConfigError(
            f"study.prescreen needs a GPU profile; engine.gpu is {cfg.engine.gpu!r}; "
            f"allowed: {sorted(GPU_PROFILES)}"
        )
    needed = {o.metric for o in cfg.objective.objectives}
    if cfg.objective.slo_constraints:
        slo = cfg.workload.slo
        q = cfg.objective.slo_percentile
        needed |= {
            f"{m}_p{q}_ms"
            for m, lim in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2e", slo.e2e_ms))
            if lim is not None
        }
    missing = sorted(needed - set(METRICS))
    if missing:
        capacity = " (a capacity search per config; objective=goodput ranks by the SLOs too)"
        raise ConfigError(
            f"study.prescreen cannot predict {missing} (objectives or SLO constraints)"
            + (capacity if needs_capacity(cfg.objective) else "")
            + f"; the simulator's landscape measures {list(METRICS)}; "
            "set study.prescreen.trials=0"
        )


def _alike(a: Sequence[float], b: Sequence[float]) -> bool:
    """Two configs the simulator measures the same (every objective within ``ALIKE``) would most
    likely measure the same on the GPU too (e.g. a gmu or max_num_seqs change that does not bind):
    only the first of them is worth a launch."""
    return all(math.isclose(x, y, rel_tol=ALIKE) for x, y in zip(a, b, strict=True))


def _key(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Two configs are the same pick if their passed flags agree (floats to two decimals)."""
    return tuple(sorted((k, round(v, 2) if isinstance(v, float) else v) for k, v in params.items()))


IMAGES_NOTE = "study.prescreen ranks configs for image requests as for text: " + IMAGES_BLIND_SPOT


def landscape_gpu(cfg: TunerConfig) -> tuple[GpuProfile | None, str]:
    """The GPU the simulator's landscape models for ``cfg``, and what this machine's is: the
    leased GPU's profile (NVML, with ``engine.kind: vllm``; else ``engine.gpu``) where its models
    were measured on that GPU (:data:`tuner.memory.GPU_PROFILES`: the H200, and the H100 SXM,
    which runs the H200's speed model), else None: on another GPU its times would be an
    H200's."""
    leased = gpu_of(cfg)
    profile = leased.profile
    if profile is not None and profile.name in GPU_PROFILES:
        return profile, leased.source
    return None, leased.source


def prescreen(
    cfg: TunerConfig, shape: ModelShape, requests: Sequence[RequestSpec]
) -> tuple[list[Pick], dict[str, Any]]:
    """Search the landscape; return the configs to enqueue (best first) and a summary."""
    check(cfg)
    p = cfg.study.prescreen
    w = cfg.workload
    gpu, source = landscape_gpu(cfg)
    if gpu is None:
        log.warning(
            "study.prescreen ranks configs on the simulator's model of %s; this machine's GPU is "
            "%s, which it was not calibrated on: its picks are an %s's",
            ", ".join(GPU_PROFILES), source, cfg.engine.gpu.upper(),
        )  # fmt: skip
        gpu = GPU_PROFILES[cfg.engine.gpu]
    if w.images is not None:
        log.warning(IMAGES_NOTE)
    space = cfg.space
    dists = distributions(space)
    objective = cfg.objective
    signs = [1.0 if o.direction == "maximize" else -1.0 for o in objective.objectives]
    second = build_requests(replace(w, seed=w.seed + 1), cfg.model.files)
    streams = [prepare_stream(r, w.system_prompt_tokens) for r in (requests, second)]
    baseline_key = _key(passed_params(space, defaults(space)))

    def one(
        params: Mapping[str, Any], stream: PreparedStream
    ) -> tuple[list[float], dict[str, float]]:
        r = evaluate(
            shape,
            gpu,
            passed_params(space, params),
            stream,
            concurrency=w.arrival.concurrency,
            slo=w.slo,
        )
        if not r.feasible:
            return list(failure_values(objective)), constraints({}, r.failure, objective, w.slo)
        m = _metrics(r)
        return list(objective_values(m, objective)), constraints(m, None, objective, w.slo)

    def run(params: Mapping[str, Any]) -> tuple[list[float], dict[str, float], list[list[float]]]:
        """The worse of the two streams per objective and constraint, and each stream's values."""
        try:
            precheck(cfg, shape, resolved(space, params), requests)
        except TrialFailed as exc:
            fail = list(failure_values(objective))
            return fail, constraints({}, exc.reason.value, objective, w.slo), [fail, fail]
        runs = [one(params, stream) for stream in streams]
        per_stream = [v for v, _ in runs]
        worst = [
            min(vals) if s > 0 else max(vals)
            for s, vals in zip(signs, zip(*per_stream, strict=True), strict=True)
        ]
        cons = {k: max(c[k] for _, c in runs) for k in runs[0][1]}
        return worst, cons, per_stream

    with warnings.catch_warnings():  # multivariate TPE is "experimental"
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            seed=cfg.study.seed, n_startup_trials=min(10, p.trials), multivariate=True
        )
    with quiet_optuna():
        study = optuna.create_study(
            directions=[
                optuna.study.StudyDirection.MAXIMIZE
                if s > 0
                else optuna.study.StudyDirection.MINIMIZE
                for s in signs
            ],
            sampler=sampler,
        )
        t0 = time.perf_counter()
        step = max(1, p.trials // 5)
        for i in range(p.trials):
            trial = study.ask(dists)
            values, cons, per_stream = run(trial.params)
            for name, value in cons.items():
                trial.set_constraint(name, value)
            trial.set_user_attr("streams", per_stream)
            study.tell(trial, values)
            if (i + 1) % step == 0 or i + 1 == p.trials:
                log.info(
                    "prescreen: %d/%d configs on the simulator (%.0f s)",
                    i + 1,
                    p.trials,
                    time.perf_counter() - t0,
                )
    done = [
        t
        for t in study.trials
        if t.values is not None and all(v <= 0 for v in t.constraints.values())
    ]

    def rank(values: Sequence[float]) -> tuple[float, ...]:
        return tuple(-s * v for s, v in zip(signs, values, strict=True))

    # best first on the first objective (for a Pareto study: the front first)
    front = {t.number for t in study.best_trials} if len(signs) > 1 else set()
    done.sort(key=lambda t: (t.number not in front, rank(t.values)))
    chosen: list[optuna.trial.FrozenTrial] = []
    seen = {baseline_key}
    for t in done:
        key = _key(passed_params(space, t.params))
        if key in seen or any(_alike(t.values, c.values) for c in chosen):
            continue
        seen.add(key)
        chosen.append(t)
        if len(chosen) == p.top:
            break
    picks = []
    for t in chosen:
        predicted: dict[str, float] = {}
        for i, o in enumerate(objective.objectives):
            predicted[o.metric] = t.values[i]
            for k, vals in enumerate(t.user_attrs["streams"], start=1):
                predicted[f"{o.metric}_stream{k}"] = vals[i]
        picks.append(Pick(dict(t.params), predicted))
    summary: dict[str, Any] = {
        "trials": p.trials,
        "feasible": len(done),
        "enqueued": len(picks),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    log.info(
        "prescreen: %d configs in %.0f s (%d feasible); enqueued %d (the worse of two request "
        "streams): %s",
        p.trials,
        summary["seconds"],
        len(done),
        len(picks),
        "; ".join(
            ", ".join(f"{o.metric} {_fmt(pk.predicted[o.metric])}" for o in objective.objectives)
            for pk in picks
        )
        or "none",
    )
    return picks, summary


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's INFO lines (study created, per trial) off while an in-memory study runs."""
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def _fmt(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else str(v)


async def predict_start(
    cfg: TunerConfig, shape: ModelShape, requests: Sequence[RequestSpec], params: Mapping[str, Any]
) -> Start | None:
    """Where a trial's capacity search goes after its own replay before the study has a
    capacity (``objective.capacity.predict_start``): the highest load that held in the
    landscape's search for ``params``' SLO capacity (live, a narrow hold there climbs ×1.045 and
    a failure just above it closes the bracket). That search is :func:`tuner.capacity.search`
    over the real search's steps (:func:`tuner.capacity_probe.step_replay`), judged as they are
    (:func:`tuner.capacity_probe.step_of`), each replayed in virtual time
    (:func:`tuner.sim.landscape.records`) instead of on the server. A prediction (``binding``
    False): a loss there narrows the bracket below it and caps nothing. On the simulator it is
    the simulated server's own model, so the live search needs about 3 replays instead of 8; on
    a GPU it is the calibrated model's guess (chat's defaults from 64 in flight: 68.41 req/s
    predicted, 65.38-66.04 measured on an H200 on 2026-12-05, docs/gpu-runs/
    2026-12-05-capacity-study-fork.md; on 86 H100 servers -4.5 ... +4.7 % for the defaults and
    fp8 weights where TPOT binds, +13 % for chat's fp8 KV cache there; +20 % for chat's defaults
    at their own SLO, where TTFT binds; ``benchmarks/predicted_capacity.py``). None where
    :func:`predict_capacity` says none, or nothing held. ``requests``: the workload's own stream
    (the first step)."""
    t0 = time.perf_counter()
    cap = await predict_capacity(cfg, shape, requests, params)
    if cap is None:
        return None
    held = [s.factor for s in cap.steps if s.held and s.factor <= cap.factor]
    if cap.rps <= 0 or not held:
        return None
    log.info(
        "  the simulator predicts an SLO capacity of %.3gx the workload's load (%.2f req/s; "
        "%d steps in virtual time, %.1f s); the search goes to the highest load that held there, "
        "%.3gx",
        cap.factor,
        cap.rps,
        len(cap.steps),
        time.perf_counter() - t0,
        max(held),
    )
    return Start(max(held), binding=False)


async def predict_capacity(
    cfg: TunerConfig, shape: ModelShape, requests: Sequence[RequestSpec], params: Mapping[str, Any]
) -> Capacity | None:
    """The landscape's search for ``params``' SLO capacity on ``cfg``'s workload and GPU
    (:func:`predict_start`'s). None where the landscape cannot say: no capacity objective, an
    open loop, a GPU its models were not measured on (:func:`landscape_gpu`), or a config it
    refuses."""
    w = cfg.workload
    if not (
        needs_capacity(cfg.objective)
        and cfg.objective.capacity.predict_start
        and w.arrival.kind == "concurrency"
        and w.trace is None
    ):
        return None
    gpu, source = landscape_gpu(cfg)
    if gpu is None:
        log.info(
            "  no capacity prediction: the simulator's models were measured on %s, not on this "
            "machine's GPU (%s); the first search starts from the workload's load",
            ", ".join(GPU_PROFILES), source,
        )  # fmt: skip
        return None
    passed = passed_params(cfg.space, params)
    judged = replace(cfg.objective, slo_constraints=True)  # as the real steps are judged

    def step(rp: Replay, factor: float) -> Step | None:
        recs = records(
            shape,
            gpu,
            passed,
            rp.requests,
            concurrency=rp.workload.arrival.concurrency,
            system_prompt_tokens=w.system_prompt_tokens,
        )
        return None if recs is None else step_of(factor, rp, Measured(recs, {}, None), judged)

    base = Replay("", list(requests), w)
    first = await asyncio.to_thread(step, base, 1.0)
    if first is None:
        return None

    async def probe(factor: float) -> Step:
        rp = await asyncio.to_thread(step_replay, judged, base, factor, cfg.model.files, "")
        got = await asyncio.to_thread(step, rp, whole_load(base, factor))
        assert got is not None  # the same config started for the first step
        return got

    return await search(
        probe, cfg.objective.capacity, first=first, loads=functools.partial(whole_load, base)
    )
