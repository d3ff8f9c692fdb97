"""Simulated engine core: a continuous-batching scheduler, paged KV blocks and a step-time model.

What is modelled (after vLLM v1's ``Scheduler``):

- Each step serves the running requests first (oldest first: a decode token each, or the next
  prefill chunk), then admits waiting requests while fewer than ``max_num_seqs`` run, spending at
  most ``max_num_batched_tokens`` tokens. With chunked prefill off, a prompt is prefilled whole
  or not at all in a step.
- KV blocks of ``block_size`` tokens come from a fixed pool (``kv_tokens / block_size`` blocks).
  When a running request needs a block and none is free, the newest running request is preempted
  (recompute: its blocks are freed and everything it holds must be prefilled again; tokens already
  streamed stay streamed) and a preemption is counted.
- Prefix caching: full prompt blocks are hashed (chained over the token ids); a new request reuses
  the cached leading blocks and skips their prefill. Freed hashed blocks stay cached until evicted
  (LRU) for a new allocation. Queries and hits are counted in tokens, as vLLM does.
- Step time = overhead + c_tok x (prefill tokens + decode seqs) + c_ctx x sum(decode context)
  + c_pair x (prefill query, key) pairs (+ c_short x each decode sequence's context up to
  ``NARROW_KV_FROM`` with an fp8 KV cache), see :class:`SpeedModel`; a compiled step that no
  CUDA graph runs takes at least the host's kernel launches (:data:`UNGRAPHED_FLOOR_S`).
- Async scheduling (vLLM's default): the host schedules step N + 1 and processes step N's outputs
  while the GPU runs step N, so the fitted step time holds no host time. With
  ``--no-async-scheduling`` each step also waits for that host work:
  :meth:`SpeedModel.host_time`, ``host_s + host_per_seq_s x`` the step's sequences.

Not modelled: sampling, stop strings/EOS (every request produces exactly its ``max_tokens``),
priorities, speculative decoding, encoder caches, LoRA.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import hashlib
import math
from collections.abc import Sequence
from typing import Literal

from tuner.memory import MemoryEstimate, ModelShape, ResolvedParams, weight_bytes

__all__ = [
    "BlockPool",
    "ClosedLoopResult",
    "EngineStats",
    "GraphKind",
    "Request",
    "Scheduler",
    "SpeedModel",
    "StepResult",
    "block_hashes",
    "build_scheduler",
    "graph_kind",
    "simulate_closed_loop",
]

# Reference model for the speed constants: Qwen3-8B (8.19e9 parameters, 36 layers).
REF_PARAMS = 8.19e9
REF_LAYERS = 36
REF_KV_BYTES_PER_TOKEN = 147_456
REF_ATTN_PAIR = 32 * 128 * 36  # query heads x head_dim x layers
WEIGHT_STREAM_S = 0.0030
"""Seconds a step spends streaming the reference model's 16-bit weights (part of the overheads)."""
NARROW_KV_FROM = 1024
"""Context tokens per sequence before an fp8 KV cache reads faster (:class:`SpeedModel`): chosen
2026-12-06 among 0-4,096 on the 20 calibration points with an fp8 cache (chat's short contexts
+13 ... +19 % tok/s at 0, -4 ... +1 % here; docs/sim-calibration.md)."""
FP8_GEMM_SPEEDUP = 1.5
"""How much faster the per-token cost runs with online fp8 weights (``--quantization fp8``):
fitted (``benchmarks/sim_fp8_weights.py``, 2026-12-06) to the fp8/defaults ratios of TPOT p50 and
output tok/s that 3 + 3 H200 servers measured on chat at 256 and 384 in flight (0.786 and
1.15-1.20; the simulator 0.80-0.81 and 1.22). With fewer weight bytes streamed alone (1.0) it
gave 0.95 and 1.05: most of the gain is the GEMMs'."""
TP_EXPONENT = 0.25
UNGRAPHED_FLOOR_S = 0.016
"""The least time a step of the compiled model without CUDA graphs (:data:`GraphKind`
``ungraphed``) takes at the reference model: the host's time to launch its kernels one by one,
which the GPU's work hides only when it is longer. Such a step takes the larger of the two
(:meth:`SpeedModel.step_time`). The defaults run without graphs only steps of more than 512 tokens
(the largest capture size), whose work at the reference model is at least 12.8 ms and, with the
decodes' context, mostly more; a smaller capture size or FULL_DECODE_ONLY also leaves the small
mixed steps of a moderate load ungraphed. Chosen 2026-12-07 among 12.5-20 ms by the simulator's
screens of ``--max-cudagraph-capture-size 128``, ``--max-num-seqs 128`` (capture size 256) and
FULL_DECODE_ONLY at TPOT p95 <= 15 ms against an H100's (-7.7, -5.7 and +0.3 %; this value reads
-4.8, -3.5 and -4.6 %), docs/sim-calibration.md."""
HOST_S = 0.0030
HOST_PER_SEQ_S = 1.0e-5
"""The host's time per step that async scheduling hides behind the GPU's (scheduling, input
preparation, output processing), paid between steps with ``--no-async-scheduling``:
``HOST_S + HOST_PER_SEQ_S x`` the step's sequences. Chosen 2026-12-07 among seven pairs
(1-4 ms, 0-0.04 ms a sequence) by the simulator's screen of ``no_async_scheduling`` against the
two GPU screens of it: chat at TPOT p95 <= 15 ms, -41.3 % on an H100
(docs/gpu-runs/2026-12-07-tpot15-h100-5.md), and chat at its own SLO, -13.3 % on an H200
(docs/gpu-runs/2026-12-03-levers-screen.md); this pair reads -38.5 % and -15.7 %. Those GPU
runs' TPOT p50 at the same running batch rose by about 2.6 ms at 30-48 running (the H100) and
7.5 ms at 110-210 (the H200): a steeper slope (1 ms + 0.04 ms a sequence) lost 30 % at chat's
own SLO. Host time is the CPU's, not the model's: the same for every shape and TP
(docs/sim-calibration.md)."""


GraphKind = Literal["full", "piecewise", "ungraphed", "eager"]
"""How vLLM runs one engine step: a FULL CUDA graph; the torch.compile'd model with PIECEWISE
graphs (the mode has them and the step's tokens fit a capture size) or without graphs; or eagerly
(``--enforce-eager``, which in vLLM 0.24 turns off torch.compile as well as CUDA graphs)."""


def graph_kind(
    cudagraph_mode: str, max_graph_batch: int, prefill_tokens: int, decode_seqs: int
) -> GraphKind:
    """The step's :data:`GraphKind` under the resolved ``cudagraph_mode``.

    A decode-only step of at most ``max_graph_batch`` (the largest capture size) sequences
    replays a FULL graph in the FULL* modes. Every other step runs the compiled model: with
    PIECEWISE graphs where the mode has them (FULL_AND_PIECEWISE, PIECEWISE) and its tokens fit a
    capture size, else without graphs (``ungraphed``: a step of more tokens than the largest
    capture size in every mode, ``vllm/v1/cudagraph_dispatcher.py``'s ``num_tokens > max_size``,
    and the mixed steps of FULL_DECODE_ONLY and FULL). NONE is charged as eager: the simulator
    does not tell it from ``--enforce-eager``.
    """
    mode = cudagraph_mode.upper()
    if mode == "NONE" or max_graph_batch <= 0:
        return "eager"
    if mode.startswith("FULL") and prefill_tokens == 0 and 0 < decode_seqs <= max_graph_batch:
        return "full"
    if mode in ("FULL_AND_PIECEWISE", "PIECEWISE") and prefill_tokens + decode_seqs <= (
        max_graph_batch
    ):
        return "piecewise"
    return "ungraphed"


@dataclasses.dataclass(frozen=True)
class SpeedModel:
    """Seconds per engine step, calibrated on Qwen3-8B on one H200 (vLLM 0.24).

    ``step = overhead + per_token x (prefill_tokens + decode_seqs) + per_ctx x sum(decode ctx)
    + per_prefill_pair x prefill attention pairs + per_short_ctx x sum(min(ctx, narrow_kv_from))``
    (a prompt chunk of ``n`` tokens after ``p`` computed ones attends to ``n p + n (n + 1) / 2``
    key tokens; the last term only with an fp8 KV cache).
    ``overhead`` depends on how vLLM runs the step (:func:`graph_kind`): ``overhead_graph_s`` for
    a decode-only step whose batch fits a captured FULL CUDA graph, ``overhead_piecewise_s`` for
    any other step of the compiled model (whether PIECEWISE graphs or none run it), and
    ``overhead_eager_s`` under ``--enforce-eager`` or ``cudagraph_mode`` NONE (until 2026-12-07
    the mixed steps of FULL_DECODE_ONLY / FULL were charged eager). A compiled step without
    graphs takes at least ``ungraphed_floor_s`` (:data:`UNGRAPHED_FLOOR_S`). The reference constants
    were fitted (2026-11-30, ``benchmarks/sim_calibration.py --fit``, see
    ``docs/sim-calibration.md``) to 31 real TP=1 runs in
    ``benchmarks/calibration/h200-qwen3-8b.json``: the chat profile at 256 in flight (10 configs
    plus repeats), at 64 in flight (defaults and 5 searched configs),
    ``/v1/completions`` 512-token prompts at 8 and 64 in flight, ``vllm bench serve`` random
    512/256 at 256 in flight (defaults, ``--enforce-eager``, gmu 0.30), and the long_docs profile
    (4k-32k-token documents) at 32 in flight (4 configs, 2 with an fp8 KV cache, plus 2 repeats):
    median error 5 % on output tok/s, 12 % on TTFT p50, 5 % on TPOT p50. Constants scale with
    parameter count (compute), layer count (launch overhead), KV bytes per token (decode
    attention reads), query heads x head_dim x layers (prefill attention FLOPs) and TP (1/TP
    compute plus an all-reduce cost per step).
    """

    overhead_graph_s: float = 0.00613
    overhead_piecewise_s: float = 0.00589
    overhead_eager_s: float = 0.0158
    per_token_s: float = 1.34e-5
    per_ctx_token_s: float = 4.62e-8
    tp_overhead_s: float = 0.0020
    frontend_s_per_running: float = 0.00189
    """API-server admission delay per running request (tokenising, SSE streaming load), at one
    streamed output per token; :meth:`Scheduler.add` divides it by ``--stream-interval``."""
    per_prefill_pair_s: float = 1.59e-9
    """Prefill attention per (query token, key token) pair: a prompt chunk of ``n`` tokens after
    ``p`` computed ones costs ``n p + n (n + 1) / 2`` pairs (causal)."""
    fp8_gemm_speedup: float = FP8_GEMM_SPEEDUP
    """``per_token_s`` is divided by it with online fp8 weights (``--quantization fp8``)."""
    narrow_kv_from: int = NARROW_KV_FROM
    """A KV cache narrower than the model's dtype (fp8) reads faster only past this many context
    tokens of each sequence; before them at the 16-bit cost (``per_short_ctx_s``)."""
    per_short_ctx_s: float = 0.0
    """What each of a sequence's first ``narrow_kv_from`` context tokens costs on top of
    ``per_ctx_token_s`` (set by :meth:`for_model` for a narrower KV cache; 0 otherwise)."""
    host_s: float = HOST_S
    host_per_seq_s: float = HOST_PER_SEQ_S
    """:meth:`host_time`'s constants (:data:`HOST_S`, :data:`HOST_PER_SEQ_S`)."""
    ungraphed_floor_s: float = UNGRAPHED_FLOOR_S
    """The least time of a compiled step without graphs (:data:`UNGRAPHED_FLOOR_S`)."""

    @classmethod
    def for_model(
        cls,
        shape: ModelShape,
        tp: int = 1,
        kv_dtype_bytes: int = 2,
        base: SpeedModel | None = None,
        quantization: str | None = None,
    ) -> SpeedModel:
        """The constants for ``shape`` at ``tp``, scaled from ``base`` (default: the Qwen3-8B
        calibration, ``cls()``). With ``quantization`` ``fp8`` (online fp8 weights) each step
        streams :func:`tuner.memory.weight_bytes` instead of the checkpoint's bytes, and the
        linear layers run fp8 GEMMs (``per_token_s / fp8_gemm_speedup``)."""
        base = base or cls()
        # TP on one host scales far from linearly at this size (all-reduce per layer, small
        # GEMMs): the real TP=2 run was only ~4 % faster than TP=1.
        compute = shape.param_count / REF_PARAMS / tp**TP_EXPONENT
        launch = shape.num_layers / REF_LAYERS
        kv_per_byte = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim  # K and V
        # Decode attention streams each context token's K and V once per step: its cost is the KV
        # bytes read (an fp8 cache reads half; at 32 x 18k-token contexts that is the measured
        # TPOT 75 -> 62.5 ms, so no dequantisation penalty is charged) -- but only past each
        # sequence's first NARROW_KV_FROM tokens: on chat's ~700-token contexts at 256 in flight
        # the H200's fp8 cache left TPOT p50 where it was (26.1 -> 26.0 ms).
        attn = kv_per_byte * kv_dtype_bytes / REF_KV_BYTES_PER_TOKEN / tp**TP_EXPONENT
        narrower = max(0, shape.dtype_bytes - kv_dtype_bytes)  # the bytes the first tokens keep
        short = kv_per_byte * narrower / REF_KV_BYTES_PER_TOKEN / tp**TP_EXPONENT
        # Prefill attention is compute: query heads x head_dim x layers multiply-adds per (query,
        # key) pair, the same with an fp8 KV cache (the long_docs runs show no fp8 gain there).
        pair_flops = shape.num_attention_heads * shape.head_dim * shape.num_layers
        prefill_attn = pair_flops / REF_ATTN_PAIR / tp**TP_EXPONENT
        extra = base.tp_overhead_s if tp > 1 else 0.0
        weights_read = WEIGHT_STREAM_S * (compute - 1.0)  # weight streaming relative to the 8B
        gemm = 1.0
        if quantization == "fp8" and shape.weight_bytes:
            # fp8 weights stream fewer bytes each step (the embeddings stay 16-bit)
            saved = 1.0 - weight_bytes(shape, quantization) / shape.weight_bytes
            weights_read -= WEIGHT_STREAM_S * compute * saved
            gemm = base.fp8_gemm_speedup
        return cls(
            overhead_graph_s=max(0.0008, base.overhead_graph_s * launch + weights_read) + extra,
            overhead_piecewise_s=max(0.0012, base.overhead_piecewise_s * launch + weights_read)
            + extra,
            overhead_eager_s=max(0.002, base.overhead_eager_s * launch + weights_read) + extra,
            per_token_s=base.per_token_s * compute / gemm,
            per_ctx_token_s=base.per_ctx_token_s * attn,
            per_prefill_pair_s=base.per_prefill_pair_s * prefill_attn,
            tp_overhead_s=extra,
            frontend_s_per_running=base.frontend_s_per_running,
            fp8_gemm_speedup=base.fp8_gemm_speedup,
            narrow_kv_from=base.narrow_kv_from,
            per_short_ctx_s=base.per_ctx_token_s * short,
            host_s=base.host_s,
            host_per_seq_s=base.host_per_seq_s,
            # kernel launches: one set a layer, and TP's all-reduces
            ungraphed_floor_s=base.ungraphed_floor_s * launch + extra,
        )

    def step_time(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        decode_ctx: int,
        graph: GraphKind,
        prefill_pairs: int = 0,
        short_ctx: int = 0,
    ) -> float:
        """``short_ctx``: the decode sequences' context tokens within their first
        ``narrow_kv_from`` (``per_short_ctx_s``)."""
        if graph == "full":
            overhead = self.overhead_graph_s
        elif graph == "eager":
            overhead = self.overhead_eager_s
        else:
            overhead = self.overhead_piecewise_s
        step = (
            overhead
            + self.per_token_s * (prefill_tokens + decode_seqs)
            + self.per_ctx_token_s * decode_ctx
            + self.per_prefill_pair_s * prefill_pairs
            + self.per_short_ctx_s * short_ctx
        )
        return max(step, self.ungraphed_floor_s) if graph == "ungraphed" else step

    def host_time(self, seqs: int) -> float:
        """The host's seconds between two steps of ``seqs`` sequences with async scheduling off
        (:data:`HOST_S`); with it on (vLLM's default) they overlap the GPU's and cost nothing."""
        return self.host_s + self.host_per_seq_s * seqs


@dataclasses.dataclass(eq=False)
class Request:
    """One request inside the engine. ``tokens`` are the prompt token ids."""

    rid: str
    tokens: Sequence[int]
    max_tokens: int
    arrival_s: float = 0.0
    ready_s: float = 0.0
    num_computed: int = 0
    num_output: int = 0
    blocks: list[int] = dataclasses.field(default_factory=list)
    hashed_blocks: int = 0
    first_token_s: float | None = None
    finished: bool = False
    admitted: bool = False

    @property
    def num_prompt(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        """Tokens whose KV must exist before the next token can be sampled."""
        return self.num_prompt + self.num_output


class BlockPool:
    """Paged KV blocks with ref counts and a hash -> block prefix cache (LRU eviction)."""

    def __init__(self, num_blocks: int, block_size: int, caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.free: collections.deque[int] = collections.deque(range(num_blocks))
        self.refs = [0] * num_blocks
        self.block_hash: dict[int, bytes] = {}
        self.cached: dict[bytes, int] = {}
        self.evictable: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.used = 0

    @property
    def num_free(self) -> int:
        return len(self.free) + len(self.evictable)

    def usage(self) -> float:
        return self.used / self.num_blocks if self.num_blocks else 0.0

    def allocate(self, n: int) -> list[int] | None:
        if n > self.num_free:
            return None
        out: list[int] = []
        for _ in range(n):
            if self.free:
                b = self.free.popleft()
            else:
                b, _ = self.evictable.popitem(last=False)
                h = self.block_hash.pop(b)
                if self.cached.get(h) == b:
                    del self.cached[h]
            self.refs[b] = 1
            out.append(b)
        self.used += n
        return out

    def touch(self, b: int) -> None:
        """Take a reference on a cached block (prefix hit)."""
        if self.refs[b] == 0:
            self.evictable.pop(b, None)
            self.used += 1
        self.refs[b] += 1

    def release(self, blocks: Sequence[int]) -> None:
        for b in reversed(blocks):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.used -= 1
                if b in self.block_hash:
                    self.evictable[b] = None
                else:
                    self.free.append(b)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, as vLLM's ``/reset_prefix_cache``; refused (False) while
        a request still holds blocks."""
        if self.used:
            return False
        for b in list(self.evictable):
            self.free.append(b)
        self.evictable.clear()
        self.block_hash.clear()
        self.cached.clear()
        return True

    def register(self, b: int, h: bytes) -> None:
        if self.caching and h not in self.cached and b not in self.block_hash:
            self.cached[h] = b
            self.block_hash[b] = h


def block_hashes(tokens: Sequence[int], block_size: int, salt: bytes = b"") -> list[bytes]:
    """Chained hashes of the full blocks of ``tokens`` (like vLLM's ``hash_block_tokens``)."""
    out: list[bytes] = []
    prev = salt
    n = len(tokens) // block_size
    raw = array.array("q", tokens[: n * block_size]).tobytes()  # 8 bytes a token id
    width = 8 * block_size
    for i in range(n):
        prev = hashlib.blake2b(prev + raw[i * width : (i + 1) * width], digest_size=16).digest()
        out.append(prev)
    return out


@dataclasses.dataclass
class EngineStats:
    """Cumulative counters (exported as Prometheus counters by the server)."""

    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0


@dataclasses.dataclass
class StepResult:
    duration_s: float
    """Simulated duration of the step (before any speed-up)."""
    emitted: list[Request]
    """Requests that produced one new output token in this step."""
    finished: list[Request]
    prefill_tokens: int = 0
    decode_seqs: int = 0
    idle: bool = False
    """Nothing could run (waiting requests not yet past the front end)."""


class Scheduler:
    """Pure scheduling state machine: :meth:`step` plans, applies and times one engine step."""

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        chunked_prefill: bool,
        prefix_caching: bool,
        speed: SpeedModel,
        max_graph_batch: int = 0,
        cudagraph_mode: str = "FULL_AND_PIECEWISE",
        async_scheduling: bool = True,
        stream_interval: int = 1,
    ) -> None:
        self.pool = BlockPool(num_blocks, block_size, prefix_caching)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.prefix_caching = prefix_caching
        self.speed = speed
        self.max_graph_batch = max_graph_batch
        self.cudagraph_mode = cudagraph_mode
        self.async_scheduling = async_scheduling
        self.stream_interval = max(1, stream_interval)
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.stats = EngineStats()
        self._hashes: dict[str, list[bytes]] = {}

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, req: Request, now: float = 0.0) -> None:
        """Queue ``req``; it becomes schedulable after the front-end delay (simulated seconds):
        ``frontend_s_per_running`` per running request, whose streamed outputs keep the API
        server busy, over ``--stream-interval`` (one output per that many tokens). At chat's 256
        in flight `--stream-interval 8` cut TTFT p50 from 668-1,218 ms to 129-152 ms on an H200
        and an H100, TTFT p95 and capacity about unchanged (docs/sim-calibration.md)."""
        req.arrival_s = now
        delay = self.speed.frontend_s_per_running * len(self.running) / self.stream_interval
        req.ready_s = now + delay
        self.waiting.append(req)

    def abort(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._free(req)
        req.finished = True

    def _free(self, req: Request, *, forget: bool = True) -> None:
        self.pool.release(req.blocks)
        req.blocks = []
        req.hashed_blocks = 0
        if forget:
            self._hashes.pop(req.rid, None)

    def _hashes_of(self, req: Request) -> list[bytes]:
        h = self._hashes.get(req.rid)
        if h is None:
            h = block_hashes(req.tokens, self.block_size) if self.prefix_caching else []
            self._hashes[req.rid] = h
        return h

    def _ensure_blocks(self, req: Request, upto: int) -> bool:
        need = math.ceil(upto / self.block_size) - len(req.blocks)
        if need <= 0:
            return True
        got = self.pool.allocate(need)
        if got is None:
            return False
        req.blocks.extend(got)
        return True

    def _prefix_hit(self, req: Request) -> None:
        """On (re)admission: reuse cached leading prompt blocks, at least one token left to run."""
        if not self.prefix_caching or req.num_computed:
            return
        hashes = self._hashes_of(req)
        limit = (req.num_tokens - 1) // self.block_size
        hit = 0
        for h in hashes[:limit]:
            b = self.pool.cached.get(h)
            if b is None:
                break
            self.pool.touch(b)
            req.blocks.append(b)
            hit += 1
        req.hashed_blocks = hit
        req.num_computed = hit * self.block_size
        self.stats.prefix_queries += req.num_prompt
        self.stats.prefix_hits += hit * self.block_size

    def _preempt_newest(self) -> Request:
        victim = self.running.pop()
        self._free(victim, forget=False)
        victim.num_computed = 0
        self.waiting.appendleft(victim)
        self.stats.preemptions += 1
        return victim

    def step(self, now: float = float("inf")) -> StepResult:
        """Plan, apply and time one step at simulated time ``now``."""
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        i = 0
        bs = self.block_size
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            remaining = len(req.tokens) + req.num_output - req.num_computed
            new = min(remaining, budget) if self.chunked_prefill else remaining
            if new > budget:
                i += 1
                continue
            upto = req.num_computed + new
            lost = False  # a preemption here may have taken req itself (the newest) out
            while upto > len(req.blocks) * bs and not self._ensure_blocks(req, upto):
                victim = self._preempt_newest()
                preempted = lost = True
                if victim is req:
                    new = 0
                    break
            if new == 0 or (lost and req not in self.running):
                break
            scheduled.append((req, new))
            budget -= new
            i += 1
        while (
            not preempted
            and self.waiting
            and budget > 0
            and len(self.running) < self.max_num_seqs
            and self.waiting[0].ready_s <= now
        ):
            req = self.waiting[0]
            if not req.blocks:
                self._prefix_hit(req)
            remaining = req.num_tokens - req.num_computed
            new = min(remaining, budget) if self.chunked_prefill else remaining
            if new > budget or not self._ensure_blocks(req, req.num_computed + new):
                self._free(req, forget=False)
                req.num_computed = 0
                break
            self.waiting.popleft()
            self.running.append(req)
            req.admitted = True
            scheduled.append((req, new))
            budget -= new

        prefill = decode_seqs = decode_ctx = prefill_pairs = short_ctx = 0
        narrow = self.speed.narrow_kv_from if self.speed.per_short_ctx_s else 0
        for req, new in scheduled:
            if new == 1 and req.num_output > 0 and req.num_computed >= len(req.tokens):
                decode_seqs += 1
                decode_ctx += req.num_computed
                if narrow:
                    short_ctx += min(req.num_computed, narrow)
            else:
                prefill += new
                prefill_pairs += new * req.num_computed + new * (new + 1) // 2
        graph = graph_kind(self.cudagraph_mode, self.max_graph_batch, prefill, decode_seqs)
        if not scheduled:
            # Idle until the next request clears the front end.
            nxt = self.waiting[0].ready_s if self.waiting else now
            idle = nxt - now if nxt > now and now != float("inf") else 0.0
            self.stats.steps += 1
            return StepResult(max(idle, 1e-4), [], [], idle=True)
        duration = self.speed.step_time(
            prefill, decode_seqs, decode_ctx, graph, prefill_pairs, short_ctx
        )
        if not self.async_scheduling:
            duration += self.speed.host_time(len(scheduled))

        emitted: list[Request] = []
        finished: list[Request] = []
        caching = self.prefix_caching
        for req, new in scheduled:
            req.num_computed += new
            # a block to register: a full prompt block past those registered (the hashes cover
            # the prompt's full blocks only)
            if caching and req.hashed_blocks < min(req.num_computed, len(req.tokens)) // bs:
                self._register_full_blocks(req)
            if req.num_computed >= len(req.tokens) + req.num_output:
                req.num_output += 1
                if req.num_output == 1:
                    self.stats.prompt_tokens += req.num_prompt
                self.stats.generation_tokens += 1
                emitted.append(req)
                if req.num_output >= req.max_tokens:
                    req.finished = True
                    finished.append(req)
        for req in finished:
            self.running.remove(req)
            self._free(req)
        self.stats.steps += 1
        return StepResult(duration, emitted, finished, prefill, decode_seqs)

    def _register_full_blocks(self, req: Request) -> None:
        if not self.prefix_caching:
            return
        hashes = self._hashes_of(req)
        full = min(req.num_computed // self.block_size, len(hashes), len(req.blocks))
        for k in range(req.hashed_blocks, full):
            self.pool.register(req.blocks[k], hashes[k])
        req.hashed_blocks = max(req.hashed_blocks, full)


@dataclasses.dataclass(frozen=True)
class ClosedLoopResult:
    duration_s: float
    output_tok_s: float
    ttft_p50_s: float
    tpot_p50_s: float
    preemptions: int


def simulate_closed_loop(
    sched: Scheduler,
    *,
    num_requests: int,
    concurrency: int,
    prompt_len: int,
    output_len: int,
    vocab: int = 150_000,
) -> ClosedLoopResult:
    """Run ``vllm bench serve``-like closed-loop load through ``sched`` in virtual time (no I/O).

    Prompts are distinct (like the ``random`` dataset), so prefix caching finds nothing.
    """
    now = 0.0
    sent = 0
    done: list[Request] = []
    finish_s: dict[str, float] = {}

    def send() -> None:
        nonlocal sent
        base = sent * 7919
        toks = [(base + i * 31) % vocab for i in range(prompt_len)]
        sched.add(Request(f"r{sent}", toks, output_len), now)
        sent += 1

    while sent < min(concurrency, num_requests):
        send()
    while sched.has_work:
        res = sched.step(now)
        now += res.duration_s
        for req in res.emitted:
            if req.num_output == 1:
                req.first_token_s = now
        for req in res.finished:
            finish_s[req.rid] = now
            done.append(req)
            if sent < num_requests:
                send()
    ttfts = sorted((r.first_token_s or 0.0) - r.arrival_s for r in done)
    tpots = sorted(
        (finish_s[r.rid] - (r.first_token_s or 0.0)) / (r.num_output - 1)
        for r in done
        if r.num_output > 1
    )
    return ClosedLoopResult(
        duration_s=now,
        output_tok_s=sum(r.num_output for r in done) / now if now else 0.0,
        ttft_p50_s=ttfts[len(ttfts) // 2] if ttfts else 0.0,
        tpot_p50_s=tpots[len(tpots) // 2] if tpots else 0.0,
        preemptions=sched.stats.preemptions,
    )


def build_scheduler(
    shape: ModelShape, r: ResolvedParams, mem: MemoryEstimate, *, speed: SpeedModel | None = None
) -> Scheduler:
    """The scheduler for resolved params: the simulated server's and the landscape's."""
    speed = speed or SpeedModel.for_model(
        shape, r.tensor_parallel_size, r.kv_dtype_bytes, quantization=r.quantization
    )
    return Scheduler(
        num_blocks=max(1, mem.kv_tokens // r.block_size),
        block_size=r.block_size,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        chunked_prefill=r.enable_chunked_prefill,
        prefix_caching=r.enable_prefix_caching,
        speed=speed,
        max_graph_batch=max(r.capture_sizes, default=0) if r.cudagraph_mode != "NONE" else 0,
        cudagraph_mode=r.cudagraph_mode,
        async_scheduling=r.async_scheduling,
        stream_interval=r.stream_interval,
    )
