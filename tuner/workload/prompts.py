"""Token-exact prompt text cut from a corpus, and prompt-token counting with the chat template."""

from __future__ import annotations

import functools
import gzip
import json
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from tuner.errors import ConfigError

__all__ = [
    "ChatTemplate",
    "SegmentEncoder",
    "TokenCorpus",
    "load_tokenizer",
    "segment_encoder",
    "token_corpus",
]

_CHUNK_CHARS = 64_000
_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _load_tokenizer(model_dir: str) -> Tokenizer:
    """The tokenizer the server counts with.

    vLLM tokenizes with transformers' ``AutoTokenizer``, which for some model types rebuilds the
    pre-tokenizer instead of taking ``tokenizer.json`` as it is (transformers 5 loads
    ``model_type: qwen2`` as ``Qwen2Tokenizer``, with Qwen's split regex and NFC; seen on the
    H200: 6 tokens fewer than ``tokenizer.json`` on a 418-token prompt). Where transformers is
    installed (wherever vLLM is) its backend tokenizer is used; otherwise the file.
    """
    try:
        from transformers import AutoTokenizer  # optional: comes with vLLM
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None:
        try:
            tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            backend = getattr(tok, "backend_tokenizer", None)
            if isinstance(backend, Tokenizer):
                return backend
        except Exception:  # noqa: S110 - fall back to the file below
            pass
    path = str(Path(model_dir) / "tokenizer.json")
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # the tokenizers library raises a bare Exception
        raise ConfigError(f"cannot load tokenizer {path}: {exc}") from exc


def load_tokenizer(model_dir: Path | str) -> Tokenizer:
    """The model's tokenizer as a :class:`tokenizers.Tokenizer` (offline, cached per directory)."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"model directory {model_dir} has no tokenizer.json")
    with _lock:
        return _load_tokenizer(str(Path(model_dir).resolve()))


class SegmentEncoder:
    """``tokenizer.encode(text, add_special_tokens=False)`` as the concatenation of the text's
    pieces between added tokens, each piece encoded once and cached: a tokenizer splits its added
    tokens out before anything else (when none strips whitespace or is normalised), so the ids are
    the same. A chat prompt repeats its system prompt and earlier turns, so most of its encoding
    (~1 ms for 900 tokens) is a cache hit: the simulated server's chat requests and
    :func:`~tuner.workload.build_requests`' counts use it. Without such added tokens (or with one
    that strips or is normalised) it encodes the whole text."""

    def __init__(self, tokenizer: Tokenizer, max_entries: int = 8192) -> None:
        self.tokenizer = tokenizer
        self.max_entries = max_entries
        self.cache: dict[str, list[int]] = {}
        added = list(tokenizer.get_added_tokens_decoder().values())
        plain = all(not (a.lstrip or a.rstrip or a.single_word or a.normalized) for a in added)
        names = sorted({a.content for a in added}, key=len, reverse=True)
        self.split = (
            re.compile("(" + "|".join(map(re.escape, names)) + ")") if plain and names else None
        )

    def encode(self, text: str) -> list[int]:
        if self.split is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        out: list[int] = []
        for piece in self.split.split(text):
            if not piece:
                continue
            ids = self.cache.get(piece)
            if ids is None:
                ids = list(self.tokenizer.encode(piece, add_special_tokens=False).ids)
                if len(self.cache) >= self.max_entries:
                    self.cache.clear()
                self.cache[piece] = ids
            out.extend(ids)
        return out

    def counts(self, texts: Sequence[str]) -> list[int]:
        """``len(self.encode(text))`` for each text, the pieces not cached yet encoded in one
        batch (:func:`encode_texts`): :func:`~tuner.workload.build_requests` counts a stream's
        prompts so."""
        if self.split is None:
            return [len(ids) for ids in encode_texts(self.tokenizer, texts)]
        pieces = [[p for p in self.split.split(text) if p] for text in texts]
        new = list(dict.fromkeys(p for ps in pieces for p in ps if p not in self.cache))
        fresh = dict(zip(new, encode_texts(self.tokenizer, new), strict=True))
        out = [sum(len(fresh[p] if p in fresh else self.cache[p]) for p in ps) for ps in pieces]
        if len(self.cache) + len(fresh) > self.max_entries:
            self.cache.clear()
        self.cache.update(list(fresh.items())[-self.max_entries :])
        return out


@functools.lru_cache(maxsize=8)
def segment_encoder(tokenizer: Tokenizer) -> SegmentEncoder:
    """The :class:`SegmentEncoder` of ``tokenizer`` (one cache per tokenizer, e.g. per
    :func:`load_tokenizer` directory)."""
    return SegmentEncoder(tokenizer)


_FIT_ENTRIES = 65536
"""Windows :meth:`TokenCorpus.text` keeps (a few MB of text): a capacity step's stream is up to
a few thousand requests."""


class TokenCorpus:
    """A corpus tokenised once; :meth:`text` cuts token-exact windows at random offsets."""

    def __init__(self, tokenizer: Tokenizer, text: str) -> None:
        if not text.strip():
            raise ConfigError("the workload corpus is empty")
        self.tokenizer = tokenizer
        chunks: list[str] = []
        start = 0
        while start < len(text):  # split at paragraph ends so encode_batch can run in parallel
            end = text.find("\n\n", start + _CHUNK_CHARS)
            end = len(text) if end < 0 else end + 2
            chunks.append(text[start:end])
            start = end
        ids: list[int] = []
        for enc in tokenizer.encode_batch(chunks, add_special_tokens=False):
            ids.extend(enc.ids)
        self.ids = np.asarray(ids, dtype=np.int64)
        self._fits: dict[tuple[int, int, int], tuple[int, str]] = {}

    def __len__(self) -> int:
        return int(self.ids.size)

    def count(self, text: str) -> int:
        """Tokens of ``text`` without special tokens."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def offset(self, rng: np.random.Generator) -> int:
        """A window's start drawn from ``rng`` (one draw): where :meth:`texts` cuts a text."""
        return int(rng.integers(0, len(self)))

    def text(self, n_tokens: int, rng: np.random.Generator, *, attempts: int = 8) -> str:
        """Text that re-encodes to exactly ``n_tokens`` tokens (at worst within ±1 %), from one
        offset drawn from ``rng`` (:meth:`texts`)."""
        return self.texts([(self.offset(rng), n_tokens)], attempts=attempts)[0]

    def texts(
        self, slots: Sequence[tuple[int, int]], *, attempts: int = 8, offsets: int = 6
    ) -> list[str]:
        """For each ``(offset, n_tokens)``: text that re-encodes to exactly ``n_tokens`` tokens
        (at worst within ±1 %), cut at ``offset`` or, where no window there fits exactly, at up
        to ``offsets`` - 1 further offsets spread over the corpus (the closest candidate wins).

        Decoding a token window and encoding it again can merge or split tokens at the edges, so
        each window's length is corrected from the re-encoded count until it matches (up to
        ``attempts`` times). All the windows of a round are decoded and encoded in one batch (the
        tokenizer's threads, the GIL released): a chat capacity step's 2,048 requests were ~2.4 s
        one window at a time on 2 cores."""
        best: list[tuple[int, str] | None] = [None] * len(slots)
        left = [i for i, (_, n) in enumerate(slots) if n > 0]
        for j in range(offsets):
            if not left:
                break
            keys = {(self._nth(slots[i][0], j), slots[i][1], attempts) for i in left}
            fits = self._fit_all(keys)
            still = []
            for i in left:
                off, n = slots[i]
                m, candidate = fits[(self._nth(off, j), n, attempts)]
                b = best[i]
                if b is None or abs(m - n) < abs(b[0] - n):
                    best[i] = (m, candidate)
                if m != n:
                    still.append(i)
            left = still
        return [b[1] if b is not None else "" for b in best]

    def _nth(self, offset: int, j: int) -> int:
        """The ``j``-th offset tried for a window drawn at ``offset`` (0: itself), a sixth of
        the corpus apart."""
        return (offset + j * (len(self) // 6 + 1)) % len(self)

    def _window_ids(self, offset: int, k: int) -> list[int]:
        ids: list[int] = np.take(self.ids, np.arange(offset, offset + k), mode="wrap").tolist()
        return ids

    def _fit_all(
        self, keys: set[tuple[int, int, int]]
    ) -> dict[tuple[int, int, int], tuple[int, str]]:
        """Each ``(offset, n_tokens, attempts)``: the window at ``offset`` that re-encodes closest
        to ``n_tokens`` (its count, its text), cached: a capacity search builds the same seeded
        stream at several loads, and the encoding was 2.5 s of a 2,000-request step's 3 s on 2
        cores. The cache misses are fitted together, one batch per attempt."""
        out = {key: hit for key in keys if (hit := self._fits.get(key)) is not None}
        best: dict[tuple[int, int, int], tuple[int, str]] = {}
        todo = {key: key[1] for key in keys if key not in out}  # key -> the window's length
        for attempt in range(max((key[2] for key in todo), default=0)):
            active = [key for key in todo if attempt < key[2]]
            if not active:
                break
            windows = self.tokenizer.decode_batch(
                [self._window_ids(key[0], todo[key]) for key in active], skip_special_tokens=True
            )
            candidates = [str(w).strip() for w in windows]
            counts = [len(ids) for ids in encode_texts(self.tokenizer, candidates)]
            for key, candidate, m in zip(active, candidates, counts, strict=True):
                n = key[1]
                b = best.get(key)
                if b is None or abs(m - n) < abs(b[0] - n):
                    best[key] = (m, candidate)
                if m == n:
                    del todo[key]
                else:
                    todo[key] = max(1, todo[key] + n - m)
        if len(self._fits) + len(best) > _FIT_ENTRIES:
            self._fits.clear()
        self._fits.update(best)
        return {**out, **best}


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Each text's ids without special tokens, encoded in one batch (the tokenizer's threads,
    without offsets where the tokenizers library can: ``encode_batch_fast``, 0.20 and later)."""
    if not texts:
        return []
    batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    return [list(e.ids) for e in batch(list(texts), add_special_tokens=False)]


@functools.lru_cache(maxsize=8)
def _token_corpus(model_dir: str, corpus_path: str, mtime_ns: int) -> TokenCorpus:
    del mtime_ns  # part of the cache key only
    path = Path(corpus_path)
    if path.suffix == ".gz":  # the shipped corpus is gzipped (the checkout travels to the GPU)
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read()
    else:
        text = path.read_text(encoding="utf-8", errors="replace")
    return TokenCorpus(_load_tokenizer(model_dir), text)


def token_corpus(model_dir: Path | str, corpus: Path | str) -> TokenCorpus:
    """The corpus file tokenised with the model's tokenizer (cached per pair of paths)."""
    load_tokenizer(model_dir)  # validates the tokenizer path
    cpath = Path(corpus)
    if not cpath.is_file():
        raise ConfigError(f"workload.corpus {str(corpus)!r} is not a file")
    with _lock:
        return _token_corpus(
            str(Path(model_dir).resolve()),
            str(cpath.resolve()),
            cpath.stat().st_mtime_ns,
        )


def _chatml(messages: Sequence[Mapping[str, str]]) -> str:
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


class ChatTemplate:
    """Renders chat messages with the model's template for counting: ``chat_template.jinja`` where
    the model has one (transformers prefers it), else ``tokenizer_config.json``'s.

    Falls back to ChatML when the model has no template or it cannot be rendered here (jinja2
    missing, a template that needs features we do not provide).
    """

    def __init__(self, model_dir: Path | str) -> None:
        self._template: Any = None
        self._specials: dict[str, Any] = {}
        cfg_path = Path(model_dir) / "tokenizer_config.json"
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
        except (OSError, ValueError):
            cfg = {}
        source = cfg.get("chat_template")
        jinja = Path(model_dir) / "chat_template.jinja"
        if jinja.is_file():  # transformers saves the template here, and prefers this file
            try:
                source = jinja.read_text(encoding="utf-8")
            except OSError:
                pass
        if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            tok = cfg.get(key)
            self._specials[key] = tok.get("content", "") if isinstance(tok, dict) else tok or ""
        if isinstance(source, str):
            try:
                from jinja2.sandbox import ImmutableSandboxedEnvironment

                env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
                env.globals["raise_exception"] = _raise
                self._template = env.from_string(source)
            except Exception:  # jinja2 missing or the template does not compile: use ChatML
                self._template = None

    @property
    def native(self) -> bool:
        """True while the model's own template renders (False: the ChatML fallback)."""
        return self._template is not None

    def image_wrapper_tokens(self, tokenizer: Any) -> int:
        """Tokens the template puts around each image besides the one placeholder the server
        expands into the image's own tokens (Qwen-VL: ``<|vision_start|>`` and ``<|vision_end|>``
        around ``<|image_pad|>``: 2). 0 for the ChatML fallback or a template without images."""
        text = [{"role": "user", "content": "x"}]
        image = [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image"}]}]
        # render first: a template that cannot render image parts falls back to ChatML here
        with_image = self.render(image)  # type: ignore[arg-type]
        if not self.native:
            return 0
        n_image = len(tokenizer.encode(with_image, add_special_tokens=False).ids)
        n_text = len(tokenizer.encode(self.render(text), add_special_tokens=False).ids)
        return max(0, n_image - n_text - 1)

    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt string for text-only ``messages``, with the generation prompt appended."""
        if self._template is not None:
            try:
                return str(
                    self._template.render(
                        messages=list(messages), add_generation_prompt=True, **self._specials
                    )
                )
            except Exception:  # a template we cannot render outside transformers
                self._template = None
        return _chatml(messages)


def _raise(message: str) -> None:
    raise ValueError(message)
