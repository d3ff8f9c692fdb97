"""Workload config -> the deterministic request stream the replay sends.

:func:`build_requests` turns a :class:`~tuner.config.WorkloadConfig` into
``warmup_requests`` warm-up :class:`~tuner.records.RequestSpec` followed by ``num_requests``
measured ones. Everything is drawn from numpy generators spawned from ``w.seed``, so the same
config gives byte-identical request bodies.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tuner.config import DistConfig, WorkloadConfig
from tuner.errors import ConfigError
from tuner.records import RequestSpec
from tuner.workload.arrivals import arrival_gaps, arrival_times, ramp_rate
from tuner.workload.images import (
    check_image_sizes,
    image_data_url,
    image_tokens,
    make_image,
    model_image_grid,
    model_image_limit,
)
from tuner.workload.lengths import sample_lengths, stratified_integers
from tuner.workload.prompts import (
    ChatTemplate,
    TokenCorpus,
    load_tokenizer,
    segment_encoder,
    token_corpus,
)
from tuner.workload.trace import Trace, load_trace

__all__ = [
    "ChatTemplate",
    "Mix",
    "TokenCorpus",
    "Trace",
    "arrival_gaps",
    "arrival_times",
    "build_requests",
    "check_image_sizes",
    "image_data_url",
    "image_tokens",
    "load_tokenizer",
    "load_trace",
    "at_load",
    "make_image",
    "model_image_limit",
    "overhead",
    "ramp_rate",
    "request_mix",
    "sample_lengths",
    "token_corpus",
]


def at_load(w: WorkloadConfig, factor: float) -> WorkloadConfig:
    """``w`` at ``factor`` × its load: the rate (and a ramp's rates) of open-loop arrivals, the
    concurrency of a closed loop (rounded up, at least 1), a trace's speed (``time_scale`` /
    factor) and the in-flight cap (``max_concurrency``, rounded up)."""
    a = w.arrival
    arrival = dataclasses.replace(
        a,
        concurrency=max(1, math.ceil(a.concurrency * factor)),
        rate=a.rate * factor,
        ramp_start_rate=None if a.ramp_start_rate is None else a.ramp_start_rate * factor,
        ramp_end_rate=None if a.ramp_end_rate is None else a.ramp_end_rate * factor,
        max_concurrency=(
            None if a.max_concurrency is None else math.ceil(a.max_concurrency * factor)
        ),
    )
    trace = (
        None
        if w.trace is None
        else dataclasses.replace(w.trace, time_scale=w.trace.time_scale / factor)
    )
    return dataclasses.replace(w, arrival=arrival, trace=trace)


_PROBE = "Hello"
"""A user text for :func:`overhead` to measure the prompt around."""


def overhead(template: ChatTemplate | None, tokenizer: Any, system: str | None) -> int:
    """Tokens the server counts in a single-turn prompt besides the user's text: with a chat
    ``template`` what it renders around the message (Qwen's ChatML: 8), the system message
    included; else (the completions endpoint) the tokenizer's special tokens and the system
    prompt with its separator, as :func:`build_requests` joins them."""
    bare = len(tokenizer.encode(_PROBE, add_special_tokens=False).ids)
    if template is not None:
        messages = [{"role": "system", "content": system}] if system is not None else []
        messages.append({"role": "user", "content": _PROBE})
        text, specials = template.render(messages), False
    else:
        text = _PROBE if system is None else f"{system}\n\n{_PROBE}"
        specials = True
    return max(0, len(tokenizer.encode(text, add_special_tokens=specials).ids) - bare)


def build_requests(w: WorkloadConfig, model_dir: Path) -> list[RequestSpec]:
    """The request stream for ``w``: warm-ups (``warmup=True``, no arrival time) then measured.

    Indices run 0..warmup+num-1 over the whole stream. Conversations of ``w.turns`` turns are
    laid out one after another (turn k of a conversation is the request after turn k-1); the
    warm-up and measured parts each start a fresh conversation. ``prompt_tokens`` is what the
    server counts: the rendered chat template (or the completions prompt) plus, per image, its
    tokens (:func:`~tuner.workload.images.image_tokens`: the processor's grid) and the tokens
    the template puts around it (:meth:`ChatTemplate.image_wrapper_tokens`).

    With ``w.trace`` the measured requests are the trace's selected rows (``num_requests``,
    the length distributions and ``w.arrival``'s schedule are ignored): a prompt the server
    counts as the row's input tokens, ``max_tokens`` of its output tokens, ``arrival_s`` its
    scaled time since the first selected row. A trace counts the whole prompt, so the user's
    text is the row's input tokens less what the request adds around it (:func:`overhead`: the
    chat template's tokens and the system prompt, or a completions prompt's special tokens);
    a row no longer than that gets 1 token of text. Images add their tokens on top. Warm-ups
    take the lengths of the first rows, cycled.
    """
    if w.endpoint not in ("chat", "completions"):
        raise ConfigError(f"workload.endpoint is {w.endpoint!r}; allowed: chat, completions")
    if w.images is not None and w.endpoint != "chat":
        raise ConfigError("workload.images needs workload.endpoint=chat")
    endpoint: Literal["chat", "completions"] = "chat" if w.endpoint == "chat" else "completions"
    if w.trace is not None and w.turns != 1:
        raise ConfigError(
            f"workload.turns is {w.turns}; a trace replays single-turn requests (turns: 1)"
        )
    grid = None
    if w.images is not None:
        check_image_sizes(w.images, model_dir)
        grid = model_image_grid(model_dir)
    trace = load_trace(w.trace) if w.trace is not None else None
    corpus = token_corpus(model_dir, w.corpus)
    template = ChatTemplate(model_dir) if endpoint == "chat" else None
    tokenizer = corpus.tokenizer
    # the template's own tokens around each image (counted text carries no image parts)
    wrap = template.image_wrapper_tokens(tokenizer) if template and w.images is not None else 0

    _, r_text, r_img, r_arr, r_sys, _ = _generators(w.seed)
    n_warm = max(0, w.warmup_requests)
    turns = max(1, w.turns)
    arrivals: list[float] | None
    if trace is not None:
        n_meas = len(trace)
        warm_rows = np.arange(n_warm) % n_meas
        in_lens = [int(v) for v in trace.input_tokens[warm_rows]] + trace.input_tokens.tolist()
        out_lens = [int(v) for v in trace.output_tokens[warm_rows]] + trace.output_tokens.tolist()
        arrivals = trace.arrival_s.tolist()
        images_of, size_of = _image_mix(w, n_warm + n_meas)
    else:
        n_meas = w.num_requests
        mix = request_mix(w)
        in_lens, out_lens = mix.input_tokens, mix.output_tokens
        images_of, size_of = mix.images, mix.image_sizes
        arrivals = arrival_times(w.arrival, n_meas, r_arr)
    total = n_warm + n_meas
    next_size = iter(size_of)
    system = corpus.text(w.system_prompt_tokens, r_sys) if w.system_prompt_tokens > 0 else None
    if trace is not None:  # the row counts the whole prompt: the user's text is what is left
        around = overhead(template, tokenizer, system)
        in_lens = [max(1, n - around) for n in in_lens]

    def last_in_conv(i: int) -> bool:
        warm = i < n_warm
        turn = (i if warm else i - n_warm) % turns  # as request_mix numbers them
        return turn == turns - 1 or i == total - 1 or (warm and i == n_warm - 1)

    # every text's window first (one offset drawn each, in stream order: a request's text, then
    # the reply its next turn carries), then all of them cut from the corpus in batches
    slots: list[tuple[int, int]] = []
    for i in range(total):
        slots.append((corpus.offset(r_text), in_lens[i]))
        if not last_in_conv(i):
            slots.append((corpus.offset(r_text), out_lens[i]))
    texts = iter(corpus.texts(slots))

    specs: list[RequestSpec] = []
    to_count: list[str] = []  # per spec: the text the server tokenises
    history: list[tuple[Any, str, int, str]] = []  # (user content, user text, image tokens, reply)
    for i in range(total):
        warm = i < n_warm
        turn = (i if warm else i - n_warm) % turns  # as request_mix numbers them
        if turn == 0:
            history = []
        user_text = next(texts)
        content: Any = user_text
        n_images = img_tokens = 0
        if w.images is not None:
            im = w.images
            # drawn here from the pixels' generator when not stratified (as before 2026-12-05)
            n_images = (
                images_of[i] if w.stratify else int(r_img.integers(im.min_count, im.max_count + 1))
            )
            parts: list[dict[str, Any]] = [{"type": "text", "text": user_text}]
            for _ in range(n_images):
                size = next(next_size) if w.stratify else int(r_img.integers(len(im.sizes)))
                wd, ht = (int(v) for v in im.sizes[size])
                fmt = im.formats[int(r_img.integers(len(im.formats)))]
                url = image_data_url(wd, ht, fmt, r_img)
                parts.append({"type": "image_url", "image_url": {"url": url}})
                img_tokens += image_tokens(wd, ht, grid) + wrap
            if n_images:
                content = parts

        max_tokens = out_lens[i]
        if template is not None:
            messages: list[dict[str, Any]] = []
            counted: list[dict[str, str]] = []
            if system is not None:
                messages.append({"role": "system", "content": system})
                counted.append({"role": "system", "content": system})
            for h_content, h_text, _, reply in history:
                messages.append({"role": "user", "content": h_content})
                messages.append({"role": "assistant", "content": reply})
                counted.append({"role": "user", "content": h_text})
                counted.append({"role": "assistant", "content": reply})
            messages.append({"role": "user", "content": content})
            counted.append({"role": "user", "content": user_text})
            to_count.append(template.render(counted))
            extra_tokens = img_tokens + sum(h[2] for h in history)
            images_in_body = n_images + sum(
                len(h[0]) - 1 for h in history if isinstance(h[0], list)
            )
            body: dict[str, Any] = {
                "messages": messages,
                "max_tokens": max_tokens,
                "ignore_eos": True,
            }
        else:
            pieces = [system] if system is not None else []
            for _, h_text, _, reply in history:
                pieces += [h_text, reply]
            pieces.append(user_text)
            prompt = "\n\n".join(pieces)
            to_count.append(prompt)
            extra_tokens = images_in_body = 0
            body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}

        specs.append(
            RequestSpec(
                index=i,
                endpoint=endpoint,
                body=body,
                prompt_tokens=extra_tokens,  # the text's tokens are added below
                output_tokens=max_tokens,
                arrival_s=None if warm or arrivals is None else arrivals[i - n_warm],
                warmup=warm,
                images=images_in_body,
            )
        )
        if not last_in_conv(i):
            history.append((content, user_text, img_tokens, next(texts)))

    # count the server's tokens: a chat prompt (its template adds its own specials) piece by
    # piece between the specials, each piece once (turns repeat the system prompt and earlier
    # turns); completions prompts in one parallel batch
    if template is not None:
        counts = segment_encoder(tokenizer).counts(to_count)
    else:
        encoded = tokenizer.encode_batch(to_count, add_special_tokens=True)
        counts = [len(e.ids) for e in encoded]
    return [
        dataclasses.replace(s, prompt_tokens=s.prompt_tokens + n)
        for s, n in zip(specs, counts, strict=True)
    ]


@dataclasses.dataclass(frozen=True)
class Mix:
    """What each request of a synthetic stream (``w.trace`` None) carries, warm-ups first: its
    new input and output tokens (the user's text this turn and the reply's ``max_tokens``), its
    turn in the conversation, its images, and each image's size (an index into
    ``w.images.sizes``, the images in order). All stratified
    (:mod:`tuner.workload.lengths`): lengths within each turn, so that a window of requests
    carries the distributions' means. With ``w.stratify`` false the lengths are drawn
    independently and the images left to :func:`build_requests`, as before 2026-12-05."""

    input_tokens: list[int]
    output_tokens: list[int]
    turn: list[int]
    images: list[int]
    image_sizes: list[int]

    def text_tokens(self) -> list[int]:
        """Each request's text tokens, the conversation's earlier turns (input and reply)
        included: its prompt less what the template and the system prompt add."""
        out: list[int] = []
        history = 0
        for i, t in enumerate(self.turn):
            history = (
                0 if t == 0 else history + self.input_tokens[i - 1] + self.output_tokens[i - 1]
            )
            out.append(history + self.input_tokens[i])
        return out


def request_mix(w: WorkloadConfig) -> Mix:
    """The :class:`Mix` of ``w``'s stream, as :func:`build_requests` builds it (the same seed's
    generators), without its texts: cheap where the texts are not (long documents)."""
    if w.trace is not None:
        raise ConfigError("a trace's requests carry the trace's own lengths: no mix is drawn")
    n_warm, n_meas, turns = max(0, w.warmup_requests), w.num_requests, max(1, w.turns)
    # warm-ups and measured requests each start a fresh conversation
    turn = [i % turns for i in range(n_warm)] + [i % turns for i in range(n_meas)]
    r_len = _generators(w.seed)[0]
    if not w.stratify:  # independent draws over the whole stream, as before 2026-12-05; the
        # images are then drawn while the stream is built (build_requests)
        total = n_warm + n_meas
        in_lens = sample_lengths(w.input_tokens, total, r_len, stratified=False)
        out_lens = sample_lengths(w.output_tokens, total, r_len, stratified=False)
        return Mix(in_lens, out_lens, turn, [], [])
    in_lens = _per_turn(w.input_tokens, turn, turns, r_len)
    out_lens = _per_turn(w.output_tokens, turn, turns, r_len)
    images, sizes = _image_mix(w, n_warm + n_meas)
    return Mix(in_lens, out_lens, turn, images, sizes)


def _generators(seed: int) -> list[np.random.Generator]:
    """The stream's independent generators, spawned from ``seed``: lengths, texts, images'
    pixels and formats, arrivals, the system prompt, the image mix."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(6)]


def _image_mix(w: WorkloadConfig, total: int) -> tuple[list[int], list[int]]:
    """Images per request and each image's size (an index into ``w.images.sizes``), stratified
    as the lengths are: a size sets the image's tokens (none when ``w.stratify`` is false:
    :func:`build_requests` then draws them as it builds)."""
    if w.images is None or not w.stratify:
        return [], []
    r_mix = _generators(w.seed)[5]
    images = stratified_integers(w.images.min_count, w.images.max_count, total, r_mix)
    return images, stratified_integers(0, len(w.images.sizes) - 1, sum(images), r_mix)


def _per_turn(d: DistConfig, turn: list[int], turns: int, rng: np.random.Generator) -> list[int]:
    """Lengths from ``d`` for requests at these ``turn``-s, stratified over the requests of each
    turn: a later turn's prompt holds the earlier turns, so each turn's own lengths, not every
    other request's, must keep the distribution's mean over a window. Of the 470 chat requests a
    capacity step counts at 470 in flight, the first turns' prompts averaged 715-733 tokens over
    six seeds stratified over all requests in blocks of 64, 722-727 per turn in blocks of 16
    (2026-12-05)."""
    out = [0] * len(turn)
    for t in range(turns):
        where = [i for i, p in enumerate(turn) if p == t]
        for i, v in zip(where, sample_lengths(d, len(where), rng), strict=True):
            out[i] = v
    return out
