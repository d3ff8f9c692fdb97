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

from tuner.config import WorkloadConfig
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
from tuner.workload.lengths import sample_lengths
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

    r_len, r_text, r_img, r_arr, r_sys = (
        np.random.default_rng(s) for s in np.random.SeedSequence(w.seed).spawn(5)
    )
    n_warm = max(0, w.warmup_requests)
    turns = max(1, w.turns)
    arrivals: list[float] | None
    if trace is not None:
        n_meas = len(trace)
        warm_rows = np.arange(n_warm) % n_meas
        in_lens = [int(v) for v in trace.input_tokens[warm_rows]] + trace.input_tokens.tolist()
        out_lens = [int(v) for v in trace.output_tokens[warm_rows]] + trace.output_tokens.tolist()
        arrivals = trace.arrival_s.tolist()
    else:
        n_meas = w.num_requests
        in_lens = sample_lengths(w.input_tokens, n_warm + n_meas, r_len)
        out_lens = sample_lengths(w.output_tokens, n_warm + n_meas, r_len)
        arrivals = arrival_times(w.arrival, n_meas, r_arr)
    total = n_warm + n_meas
    system = corpus.text(w.system_prompt_tokens, r_sys) if w.system_prompt_tokens > 0 else None
    if trace is not None:  # the row counts the whole prompt: the user's text is what is left
        around = overhead(template, tokenizer, system)
        in_lens = [max(1, n - around) for n in in_lens]

    specs: list[RequestSpec] = []
    to_count: list[str] = []  # per spec: the text the server tokenises
    history: list[tuple[Any, str, int, str]] = []  # (user content, user text, image tokens, reply)
    for i in range(total):
        warm = i < n_warm
        turn = (i if warm else i - n_warm) % turns
        if turn == 0:
            history = []
        user_text = corpus.text(in_lens[i], r_text)
        content: Any = user_text
        n_images = img_tokens = 0
        if w.images is not None:
            im = w.images
            n_images = int(r_img.integers(im.min_count, im.max_count + 1))
            parts: list[dict[str, Any]] = [{"type": "text", "text": user_text}]
            for _ in range(n_images):
                wd, ht = (int(v) for v in im.sizes[int(r_img.integers(len(im.sizes)))])
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
        last_in_conv = turn == turns - 1 or i == total - 1 or (warm and i == n_warm - 1)
        if not last_in_conv:
            history.append((content, user_text, img_tokens, corpus.text(max_tokens, r_text)))

    # count the server's tokens: a chat prompt (its template adds its own specials) piece by
    # piece between the specials, each piece once (turns repeat the system prompt and earlier
    # turns); completions prompts in one parallel batch
    if template is not None:
        seg = segment_encoder(tokenizer)
        counts = [len(seg.encode(text)) for text in to_count]
    else:
        encoded = tokenizer.encode_batch(to_count, add_special_tokens=True)
        counts = [len(e.ids) for e in encoded]
    return [
        dataclasses.replace(s, prompt_tokens=s.prompt_tokens + n)
        for s, n in zip(specs, counts, strict=True)
    ]
