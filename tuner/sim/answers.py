"""The simulated model's greedy outputs: a text, its tokens and their logprobs for a prompt,
deterministic, so that the confirm stage's quality guard (:mod:`tuner.quality_guard`) runs on
the simulator.

The simulator has no weights; it makes its outputs up from a hash of the prompt, the same on
every server (greedy decoding: the same prompt gives the same text):

- An output is ``n`` tokens (the engine decides how many) of filler words.
- Of the project's eval set (:data:`tuner.quality.DEFAULT_EVALSET`), the simulated model "knows"
  a share :data:`ANSWER_RATE` of the items that state an answer (chosen by the hash; 0.405, the
  answer rate SmolLM2-135M-Instruct measured on the H200, docs/gpu-runs/2026-12-02-quality.md):
  those outputs begin "The answer is <answer>.". It knows no other eval set's answers.
- Numerics: the server's flags that change them (:func:`tuner.vllm_rules.numerics_changes`) make
  a share of the outputs differ from the defaults' (:data:`DIVERGE`, per flag, from the H200:
  69 % for an fp8 KV cache, 75 % for fp8 weights, none for n-gram speculative decoding; 50 % for
  another dtype), from a first differing token drawn by the hash within :data:`SPAN` tokens. A
  changed output keeps its answer (the first difference comes after it: on the H200 the fp8 KV
  cache moved the answer rate from 0.405 to 0.390) unless ``loss`` (the server's
  ``TUNER_SIM_ANSWER_LOSS``, default 0) says otherwise: that share of the changed outputs differ
  before the answer and lose it. The
  same flags give the same outputs on every server (the H200's fp8 weights differed between
  two servers on 12 % of outputs; not modelled).
- Speculative decoding: vLLM's ``spec_decode`` counters on ``/metrics``
  (:class:`SpecDecodeMetrics`), a share :data:`ACCEPTANCE` of the draft tokens accepted; its
  speed is not modelled.
- Logprobs: per token a value drawn in [-2, -0.01]; with flags that change numerics, shifted by
  up to ±0.1 over the common prefix (the H200's fp8 KV cache: mean |Δ| 0.068). The top
  alternatives: the token itself, then made-up ones below it; at the first differing position,
  the defaults' token is among them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from tuner.quality import DEFAULT_EVALSET, load_evalset
from tuner.vllm_rules import numerics_changes

__all__ = [
    "ACCEPTANCE",
    "ANSWER_RATE",
    "DIVERGE",
    "Output",
    "SpecDecodeMetrics",
    "diverge_share",
    "known_answers",
    "output",
]

ANSWER_RATE = 0.405
ACCEPTANCE = 0.387
"""The share of draft tokens accepted: n-gram speculation on the eval set on the H200 (1,608 of
4,152)."""
DIVERGE: Mapping[str, float] = {
    "kv_cache_dtype": 0.69,
    "quantization": 0.75,
    "dtype": 0.5,
    "speculative_config": 0.0,
}
WORDS = (" the", " model", " is", " fast", " and", " simulated", " tokens", " flow")
OTHER = (" a", " quick", " reply", " differs", " here", " now", " so", " it")
"""The changed outputs' words: none of them is a word of :data:`WORDS` or of the answer line."""
ALTERNATIVES = (" maybe", " perhaps", " or", " not", " some")
PREFIX = (" The", " answer", " is")
SPAN = 16
"""A changed output's first difference lies within this many tokens of the earliest it may be
(the H200's: at token 9-10 on average)."""


@dataclass(frozen=True)
class Output:
    """One greedy output (the fields of :class:`tuner.quality.Completion`)."""

    tokens: tuple[str, ...]
    logprobs: tuple[float, ...]
    top: tuple[dict[str, float], ...]

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    def chat_logprobs(self, top_n: int) -> dict[str, Any]:
        """The ``logprobs`` of an OpenAI chat choice, ``top_n`` alternatives a token."""
        return {
            "content": [
                {
                    "token": t,
                    "logprob": lp,
                    "bytes": list(t.encode()),
                    "top_logprobs": [
                        {"token": a, "logprob": alp, "bytes": list(a.encode())}
                        for a, alp in list(top.items())[:top_n]
                    ],
                }
                for t, lp, top in zip(self.tokens, self.logprobs, self.top, strict=True)
            ]
        }


def _u(*parts: object) -> float:
    """A uniform draw in [0, 1) from ``parts``."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@functools.cache
def known_answers() -> dict[str, str]:
    """The default eval set's prompt texts (its messages' contents, joined) → stated answers."""
    return {
        prompt_text(item.messages): item.answer
        for item in load_evalset(DEFAULT_EVALSET)
        if item.answer is not None
    }


def prompt_text(messages: Any) -> str:
    """The text a chat request's output is drawn from: its messages' contents, joined."""
    if not isinstance(messages, list | tuple):
        return str(messages)
    return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, Mapping))


def diverge_share(changes: Mapping[str, Any]) -> float:
    """The share of outputs that ``changes`` (``dest`` → value) make differ from the defaults':
    each flag's :data:`DIVERGE` (0.5 for one not listed), independently."""
    same = math.prod(1.0 - DIVERGE.get(k, 0.5) for k in changes)
    return 1.0 - same


def output(
    prompt: str, n: int, flags: Mapping[str, Any], *, loss: float = 0.0, alternatives: int = 5
) -> Output:
    """The greedy output of ``n`` tokens for ``prompt`` on a server run with ``flags`` (``dest``
    → value: those that change numerics count, :func:`tuner.vllm_rules.numerics_changes`)."""
    tokens = [WORDS[int(_u(prompt, "w", i) * len(WORDS))] for i in range(n)]
    answer = known_answers().get(prompt)
    at_answer: int | None = None
    if answer is not None and _u(prompt, "knows") < ANSWER_RATE:
        line = [*PREFIX, " " + answer, "."]
        tokens[: len(line)] = line[:n]
        at_answer = len(PREFIX) if n > len(PREFIX) else None
    base_lp = [-0.01 - 1.99 * _u(prompt, "lp", i) for i in range(n)]
    changes = numerics_changes(flags)
    key = json.dumps(changes, sort_keys=True, default=str)
    first: int | None = None
    if changes and _u(prompt, key, "diverge") < diverge_share(changes):
        if at_answer is not None and _u(prompt, key, "loss") < loss:
            first = int(_u(prompt, key, "at") * (at_answer + 1))  # at the answer or before
        else:
            lo = 0 if at_answer is None else at_answer + 1
            first = lo + int(_u(prompt, key, "at") * min(n - lo, SPAN)) if lo < n else None
    shift = 0.1 if changes and diverge_share(changes) > 0 else 0.0
    out_tokens = list(tokens)
    logprobs = [lp + shift * (2 * _u(prompt, key, "d", i) - 1) for i, lp in enumerate(base_lp)]
    if first is not None:
        for i in range(first, n):
            out_tokens[i] = OTHER[int(_u(prompt, key, "o", i) * len(OTHER))]
    top: list[dict[str, float]] = []
    for i, (t, lp) in enumerate(zip(out_tokens, logprobs, strict=True)):
        alts = {t: min(lp, 0.0)}
        if i == first:  # the defaults' token, just below the one this config chose
            alts[tokens[i]] = lp - 0.05
        for k, a in enumerate(ALTERNATIVES):
            if len(alts) >= max(alternatives, 1):
                break
            alts.setdefault(a, lp - 1.0 - k)
        top.append(alts)
    return Output(tuple(out_tokens), tuple(min(lp, 0.0) for lp in logprobs), tuple(top))


class SpecDecodeMetrics:
    """vLLM 0.24.0's speculative-decoding counters (``vllm/v1/spec_decode/metrics.py``) for a
    server run with ``--speculative-config``: each decode step drafts ``num_speculative_tokens``
    tokens, of which a share :data:`ACCEPTANCE` is accepted, so a step yields ``1 + ACCEPTANCE
    × K`` tokens; :meth:`update` follows the generated tokens."""

    def __init__(
        self, registry: CollectorRegistry, labels: Mapping[str, str], config: Mapping[str, Any]
    ) -> None:
        self.k = max(1, int(config.get("num_speculative_tokens") or 1))
        names = list(labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, names, registry=registry).labels(**labels)

        self.drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.accepted = counter(
            "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
        )
        self.seen = 0

    def update(self, generated: int) -> None:
        """The counters after ``generated`` tokens in all (the engine's total so far)."""
        new, self.seen = max(0, generated - self.seen), max(generated, self.seen)
        steps = new / (1.0 + ACCEPTANCE * self.k)
        self.drafts.inc(steps)
        self.draft_tokens.inc(steps * self.k)
        self.accepted.inc(steps * self.k * ACCEPTANCE)
