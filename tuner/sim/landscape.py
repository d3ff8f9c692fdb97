"""The simulator's objective landscape, in process and in virtual time (no server, no I/O).

:func:`evaluate` answers "what would a trial with these engine parameters measure?" for the
simulated engine, thousands of times faster than launching ``python -m tuner.sim serve`` and
replaying: the start-up refusals come from :func:`tuner.memory.estimate` and vLLM's config
validation, and the serving run drives the very :class:`~tuner.sim.engine.Scheduler` the simulated
server builds (same block pool, same :class:`~tuner.sim.engine.SpeedModel`, same CUDA-graph batch
limit) closed-loop at ``concurrency`` in virtual time, the way :mod:`tuner.replay` sends the
stream: warm-ups first (awaited, not measured), then the measured requests.

Token ids are synthetic but keep the prefix structure that matters to prefix caching: every
request whose body carries the same system message starts with the same ``system_prompt_tokens``
ids, a later turn of a conversation starts with all of its previous turn's prompt ids, and the rest
are ids no other request has. Metrics follow ``vllm bench serve`` (see :mod:`tuner.score`): TTFT
from send to the first token, TPOT = (e2e - ttft)/(output - 1), duration from the first measured
send to the last completion, goodput = requests meeting every SLO set / duration. A request with
``prompt + max_tokens > max_model_len`` is rejected (vLLM answers 400) and counts as not good.

With ``data_parallel_size`` DP > 1 one replica is run at its share of the concurrency (1/DP,
rounded up) and the rates are DP times its own (the replicas serve side by side, balanced).

Differences from a real replay against the simulated server: no HTTP/SSE or tokenisation time, no
``TUNER_SIM_SPEEDUP`` jitter, no ``workload.duration_s`` cut-off, and the request is "sent" the
instant the previous one of its worker finished.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tuner.config import SLOConfig
from tuner.errors import FailureReason
from tuner.memory import GpuProfile, MemoryEstimate, ModelShape, estimate
from tuner.memory import resolve_params as _resolve
from tuner.records import RequestRecord, RequestSpec
from tuner.sim.engine import (
    EngineStats,
    Request,
    Scheduler,
    SpeedModel,
    block_hashes,
    build_scheduler,
)
from tuner.sim.startup import Refusal, Settings, engine_check
from tuner.vllm_rules import api_refusal

__all__ = [
    "LandscapeResult",
    "PreparedStream",
    "build_scheduler",
    "config_refusal",
    "evaluate",
    "prepare_stream",
    "records",
]

MAX_STEPS = 5_000_000
"""Safety net against a scheduler that never drains (a bug, not a workload property)."""


@dataclasses.dataclass(frozen=True)
class LandscapeResult:
    """What one configuration measures on the simulator (zeros when infeasible)."""

    feasible: bool
    failure: str | None
    """A :class:`~tuner.errors.FailureReason` value when the engine would not start."""
    goodput: float
    """Measured requests per second that met every SLO set."""
    output_throughput: float
    """Output tokens per second of the completed measured requests."""
    ttft_p95_ms: float
    tpot_p95_ms: float
    duration_s: float
    preemptions: int
    """Preemptions during the measured phase."""
    completed: int = 0
    rejected: int = 0
    """Measured requests refused because ``prompt + max_tokens > max_model_len``."""
    kv_tokens: int = 0
    prefix_hit_rate: float = 0.0
    """Prefix-cache hits / queries (tokens) during the measured phase."""
    message: str | None = None
    """The refusal text of an infeasible configuration (vLLM's wording where the sim has it)."""
    ttft_p50_ms: float = 0.0
    tpot_p50_ms: float = 0.0


def _infeasible(failure: FailureReason, message: str | None) -> LandscapeResult:
    return LandscapeResult(
        feasible=False,
        failure=failure.value,
        goodput=0.0,
        output_throughput=0.0,
        ttft_p95_ms=0.0,
        tpot_p95_ms=0.0,
        duration_s=0.0,
        preemptions=0,
        message=message,
    )


# --- start-up ---------------------------------------------------------------------------------


def config_refusal(
    shape: ModelShape,
    gpu: GpuProfile,
    params: Mapping[str, Any],
    mem: MemoryEstimate | None = None,
) -> tuple[FailureReason, str] | None:
    """Why ``vllm serve`` (as simulated) would refuse to start with ``params``, or ``None``.

    Order as in the simulated server: the API-side config validation (``invalid_config``,
    :func:`tuner.vllm_rules.api_refusal`, the rules :func:`tuner.sim.startup.resolve` raises), then
    the EngineCore's attention-backend check and KV-cache memory checks
    (:func:`tuner.sim.startup.engine_check`, i.e. :func:`tuner.vllm_rules.backend_refusal` and
    :func:`tuner.memory.estimate`). Not checked: TP against the GPU count (the caller's lease) and
    the compilation config's consistency (the simulated server checks it on its command line).
    """
    r = _resolve(shape, gpu, params)
    found = api_refusal(shape, params, r)
    if found is not None:
        return found.reason, found.message
    mem = mem if mem is not None else estimate(shape, gpu, params)
    settings = Settings(
        model_dir=Path("."),
        shape=shape,
        gpu=gpu,
        gpu_count=max(1, r.tensor_parallel_size),
        params=dict(params),
        resolved=r,
        memory=mem,
        served_names=("m",),
        max_model_len=mem.max_model_len,
        image_limit=999,
    )
    try:
        for stage in ("backend", "kv"):
            engine_check(settings, {}, stage)
    except Refusal as exc:
        return exc.reason, exc.exc_line
    return None


# --- the request stream as token ids ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PreparedStream:
    """The request stream as the engine sees it: prompt token ids and output lengths."""

    prompts: tuple[tuple[int, ...], ...]
    max_tokens: tuple[int, ...]
    warmup: tuple[bool, ...]
    key: tuple[Any, ...]
    """Identifies the structure (lengths, shared prefixes) for caching block hashes."""


def _content_key(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True)


def _message_keys(spec: RequestSpec) -> tuple[tuple[str, str], ...] | None:
    messages = spec.body.get("messages")
    if not isinstance(messages, list):
        return None
    return tuple(
        (str(m.get("role", "")), _content_key(m.get("content", "")))
        for m in messages
        if isinstance(m, Mapping)
    )


def _estimate_system_tokens(requests: Sequence[RequestSpec]) -> int:
    """Tokens of the (first) system message from the stream's tokens-per-character ratio."""
    chars = tokens = 0
    system = None
    for spec in requests:
        keys = _message_keys(spec)
        if not keys:
            continue
        if system is None and keys[0][0] == "system":
            system = keys[0][1]
        chars += sum(len(c) for _, c in keys)
        tokens += spec.prompt_tokens
    if system is None or chars == 0:
        return 0
    return round(len(system) * tokens / chars)


_STREAMS: collections.OrderedDict[tuple[Any, ...], PreparedStream] = collections.OrderedDict()
_HASHES: collections.OrderedDict[tuple[Any, ...], tuple[list[bytes], ...]] = (
    collections.OrderedDict()
)
_CACHE_SIZE = 8


def prepare_stream(
    requests: Sequence[RequestSpec], system_prompt_tokens: int | None = None
) -> PreparedStream:
    """Synthetic prompt token ids for ``requests`` (see the module docstring).

    ``system_prompt_tokens``: the shared leading ids of requests with the same system message
    (``WorkloadConfig.system_prompt_tokens``); ``None`` estimates it from the texts. A chat
    request whose messages minus the last user turn (and the assistant reply before it) are an
    earlier request's messages continues that request's prompt ids; a completions request
    continues the previous request's ids when its prompt extends that prompt.
    """
    spt = (
        _estimate_system_tokens(requests)
        if system_prompt_tokens is None
        else max(0, system_prompt_tokens)
    )
    parents: list[int] = []
    systems: list[int] = []
    seen: dict[tuple[tuple[str, str], ...], int] = {}
    system_ids: dict[str, int] = {}
    prev_prompt: str | None = None
    for i, spec in enumerate(requests):
        parent = sys_group = -1
        keys = _message_keys(spec)
        if keys is not None:
            for k in range(len(keys) - 1, 0, -1):
                j = seen.get(keys[:k])
                if j is not None:
                    parent = j
                    break
            if keys and keys[0][0] == "system":
                sys_group = system_ids.setdefault(keys[0][1], len(system_ids))
            seen.setdefault(keys, i)
        else:
            prompt = spec.body.get("prompt")
            if isinstance(prompt, str):
                if prev_prompt and i > 0 and prompt.startswith(prev_prompt):
                    parent = i - 1
                if spt > 0:
                    sys_group = 0  # the completions profile puts the system text first
                prev_prompt = prompt
        parents.append(parent)
        systems.append(sys_group)
    key = (
        spt,
        tuple(
            (s.prompt_tokens, s.output_tokens, s.warmup, p, g)
            for s, p, g in zip(requests, parents, systems, strict=True)
        ),
    )
    cached = _STREAMS.get(key)
    if cached is not None:
        _STREAMS.move_to_end(key)
        return cached

    next_id = 1 + spt * (len(system_ids) + 1)
    prompts: list[tuple[int, ...]] = []
    for spec, parent, group in zip(requests, parents, systems, strict=True):
        n = max(1, spec.prompt_tokens)
        if parent >= 0:
            head = prompts[parent][:n]
        elif group >= 0:
            head = tuple(range(1 + group * spt, 1 + group * spt + min(spt, n)))
        else:
            head = ()
        rest = n - len(head)
        prompts.append(head + tuple(range(next_id, next_id + rest)))
        next_id += rest
    stream = PreparedStream(
        prompts=tuple(prompts),
        max_tokens=tuple(max(1, s.output_tokens) for s in requests),
        warmup=tuple(s.warmup for s in requests),
        key=key,
    )
    _STREAMS[key] = stream
    while len(_STREAMS) > _CACHE_SIZE:
        _STREAMS.popitem(last=False)
    return stream


def _stream_hashes(stream: PreparedStream, block_size: int) -> tuple[list[bytes], ...]:
    """Block hashes of every prompt (what the scheduler would compute), cached per stream."""
    key = (stream.key, block_size)
    cached = _HASHES.get(key)
    if cached is not None:
        _HASHES.move_to_end(key)
        return cached
    hashes = tuple(block_hashes(p, block_size) for p in stream.prompts)
    _HASHES[key] = hashes
    while len(_HASHES) > _CACHE_SIZE:
        _HASHES.popitem(last=False)
    return hashes


# --- serving ------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Done:
    index: int
    arrival: float
    first: float
    finish: float
    output: int


def _run_phase(
    sched: Scheduler,
    stream: PreparedStream,
    hashes: tuple[list[bytes], ...] | None,
    indices: Sequence[int],
    *,
    concurrency: int,
    max_model_len: int,
    now: float,
) -> tuple[float, list[_Done], list[int]]:
    """Closed loop over ``indices`` from ``now``: returns the end time, completions, rejections."""
    pending = iter(indices)
    done: list[_Done] = []
    ids: dict[str, int] = {}
    rejected: list[int] = []
    in_flight = 0

    def send() -> bool:
        nonlocal in_flight
        for i in pending:
            prompt = stream.prompts[i]
            if len(prompt) + stream.max_tokens[i] > max_model_len:
                rejected.append(i)  # vLLM answers 400 at once; the worker sends its next one
                continue
            rid = f"r{i}"
            ids[rid] = i
            if hashes is not None:
                # the scheduler's own per-request hash memo, filled from the per-stream cache
                sched._hashes[rid] = hashes[i]
            sched.add(Request(rid, prompt, stream.max_tokens[i]), now)
            in_flight += 1
            return True
        return False

    for _ in range(max(1, concurrency)):
        if not send():
            break
    steps = 0
    while sched.has_work:
        res = sched.step(now)
        now += res.duration_s
        steps += 1
        if steps > MAX_STEPS:
            raise RuntimeError("the simulated scheduler did not drain; this is a bug")
        for req in res.emitted:
            if req.num_output == 1:
                req.first_token_s = now
        for req in res.finished:
            done.append(
                _Done(ids[req.rid], req.arrival_s, req.first_token_s or now, now, req.num_output)
            )
            in_flight -= 1
            send()
    return now, done, rejected


def _meets(d: _Done, slo: SLOConfig) -> bool:
    ttft = d.first - d.arrival
    tpot = (d.finish - d.first) / (d.output - 1) if d.output > 1 else 0.0
    e2e = d.finish - d.arrival
    checks = ((slo.ttft_ms, ttft), (slo.tpot_ms, tpot), (slo.e2e_ms, e2e))
    return all(lim is None or v * 1000.0 <= lim for lim, v in checks)


@dataclasses.dataclass(frozen=True)
class _Served:
    """One closed-loop replay in virtual time: the measured phase's completions, its
    rejections, where it started, the replica count and the scheduler's counters around it."""

    done: list[_Done]
    rejected: list[int]
    start: float
    dp: int
    kv_tokens: int
    before: EngineStats
    after: EngineStats
    prompts: Sequence[Sequence[int]]


def _serve(
    shape: ModelShape,
    gpu: GpuProfile,
    params: Mapping[str, Any],
    requests: Sequence[RequestSpec] | PreparedStream,
    *,
    concurrency: int,
    system_prompt_tokens: int | None,
    speed_base: SpeedModel | None,
) -> _Served | LandscapeResult:
    """The replay :func:`evaluate` and :func:`records` measure; an infeasible result when the
    engine would not start."""
    mem = estimate(shape, gpu, params)
    refusal = config_refusal(shape, gpu, params, mem)
    if refusal is not None:
        return _infeasible(*refusal)
    r = _resolve(shape, gpu, params)
    stream = (
        requests
        if isinstance(requests, PreparedStream)
        else prepare_stream(requests, system_prompt_tokens)
    )
    speed = (
        None
        if speed_base is None
        else SpeedModel.for_model(
            shape, r.tensor_parallel_size, r.kv_dtype_bytes, speed_base, r.quantization
        )
    )
    sched = build_scheduler(shape, r, mem, speed=speed)
    # DP: DP replicas share the closed loop evenly (the front balances them); one is simulated
    # at its share of the concurrency, and the server serves DP times its rates
    dp = max(1, r.data_parallel_size)
    concurrency = -(-concurrency // dp)
    hashes = _stream_hashes(stream, r.block_size) if r.enable_prefix_caching else None
    n = len(stream.prompts)
    warm = [i for i in range(n) if stream.warmup[i]]
    measured = [i for i in range(n) if not stream.warmup[i]]
    now = 0.0
    if warm:
        now, _, _ = _run_phase(
            sched,
            stream,
            hashes,
            warm,
            concurrency=concurrency,
            max_model_len=mem.max_model_len,
            now=now,
        )
    start = now
    before = dataclasses.replace(sched.stats)
    _, done, rejected = _run_phase(
        sched,
        stream,
        hashes,
        measured,
        concurrency=concurrency,
        max_model_len=mem.max_model_len,
        now=start,
    )
    return _Served(
        done,
        rejected,
        start,
        dp,
        mem.kv_tokens,
        before,
        dataclasses.replace(sched.stats),
        stream.prompts,
    )


def evaluate(
    shape: ModelShape,
    gpu: GpuProfile,
    params: Mapping[str, Any],
    requests: Sequence[RequestSpec] | PreparedStream,
    *,
    concurrency: int,
    slo: SLOConfig,
    system_prompt_tokens: int | None = None,
    speed_base: SpeedModel | None = None,
) -> LandscapeResult:
    """What a trial with engine ``params`` measures on the simulator for ``requests``.

    ``params`` uses the tuner's parameter names (as :func:`tuner.memory.estimate`); absent or
    ``None`` means vLLM's default. ``requests`` is a stream from
    :func:`tuner.workload.build_requests` (warm-ups are sent first and not measured) or one
    :func:`prepare_stream` made (faster when evaluating many configurations).
    ``system_prompt_tokens`` is passed to :func:`prepare_stream`. ``speed_base``: step-time
    constants for the reference model instead of :class:`~tuner.sim.engine.SpeedModel`'s defaults
    (scaled to ``shape`` and TP as usual; ``benchmarks/sim_calibration.py --fit``).
    Deterministic: the same inputs give the same result.
    """
    served = _serve(
        shape,
        gpu,
        params,
        requests,
        concurrency=concurrency,
        system_prompt_tokens=system_prompt_tokens,
        speed_base=speed_base,
    )
    if isinstance(served, LandscapeResult):
        return served
    done, rejected, start, dp = served.done, len(served.rejected), served.start, served.dp
    before, st = served.before, served.after
    queries = st.prefix_queries - before.prefix_queries
    end = max((d.finish for d in done), default=start)
    duration = (end - start) / dp  # DP replicas serve the stream side by side
    ttfts = [d.first - d.arrival for d in done]
    tpots = [(d.finish - d.first) / (d.output - 1) for d in done if d.output > 1]
    good = sum(_meets(d, slo) for d in done)

    def pct_ms(values: list[float], q: float) -> float:
        return float(np.percentile(values, q)) * 1000.0 if values else 0.0

    return LandscapeResult(
        feasible=True,
        failure=None,
        goodput=good / duration if duration > 0 else 0.0,
        output_throughput=sum(d.output for d in done) / duration if duration > 0 else 0.0,
        ttft_p95_ms=pct_ms(ttfts, 95),
        tpot_p95_ms=pct_ms(tpots, 95),
        duration_s=duration,
        preemptions=st.preemptions - before.preemptions,
        completed=len(done),
        rejected=rejected,
        kv_tokens=served.kv_tokens,
        prefix_hit_rate=(st.prefix_hits - before.prefix_hits) / queries if queries else 0.0,
        ttft_p50_ms=pct_ms(ttfts, 50),
        tpot_p50_ms=pct_ms(tpots, 50),
    )


def records(
    shape: ModelShape,
    gpu: GpuProfile,
    params: Mapping[str, Any],
    requests: Sequence[RequestSpec],
    *,
    concurrency: int,
    system_prompt_tokens: int | None = None,
) -> list[RequestRecord] | None:
    """The measured requests of :func:`evaluate`'s replay as the replay client records them
    (send time from the measured start, TTFT, E2E, token counts; no ITL; a request over
    ``max_model_len`` an HTTP 400 error), so :mod:`tuner.score` and the capacity search judge
    them as a real replay's; None when the engine would not start. With DP replicas the send
    times are shared out over them (one replica is simulated, :func:`evaluate`)."""
    served = _serve(
        shape,
        gpu,
        params,
        requests,
        concurrency=concurrency,
        system_prompt_tokens=system_prompt_tokens,
        speed_base=None,
    )
    if isinstance(served, LandscapeResult):
        return None
    out = [
        RequestRecord(
            index=requests[d.index].index,
            status="ok",
            t_sent_s=(d.arrival - served.start) / served.dp,
            ttft_s=d.first - d.arrival,
            e2e_s=d.finish - d.arrival,
            prompt_tokens=len(served.prompts[d.index]),
            output_tokens=d.output,
        )
        for d in served.done
    ]
    out += [
        RequestRecord(
            index=requests[i].index,
            status="error",
            t_sent_s=0.0,
            http_status=400,
            error="prompt + max_tokens > max_model_len",
        )
        for i in served.rejected
    ]
    return sorted(out, key=lambda r: r.index)
