"""Output quality of a candidate server against a baseline server, on a fixed eval set.

Flags such as ``--kv-cache-dtype fp8`` or ``--quantization fp8`` change numerics: a config that
serves faster may answer worse. This module replays an eval set greedily (temperature 0, a fixed
``max_tokens``, ``logprobs`` with the top alternatives) on a server through its OpenAI chat
endpoint, and compares two such replays prompt by prompt (:func:`compare`):

- ``exact_match``: the share of prompts whose outputs are the same text;
- ``first_diff_mean``: over the prompts whose token sequences differ, the mean position (0-based,
  in tokens) of the first differing token; None when none differs;
- ``mean_abs_dlogprob``: the mean of ``|logprob_candidate - logprob_baseline|`` over the
  baseline's tokens the candidate scored in the same context: every token of the common prefix,
  and the baseline's token at the first differing position when it is among the candidate's top
  alternatives there (after the outputs diverge the contexts differ, so nothing is compared);
- ``answer_rate_*``: where an eval item states its answer, the share of each server's outputs
  that contain it as a whole word or number (an absolute check, and a crude one: both servers may
  agree on wrong answers, and an output that names the answer among others counts).

A replay is saved as JSON (:func:`save`) so that each arm runs on its own fresh server, one after
another, and any two are compared later (``python -m tuner.quality compare A.json B.json``). The
confirm stage's quality guard (:mod:`tuner.quality_guard`) replays and compares with these.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from tuner.errors import ConfigError

__all__ = [
    "DEFAULT_EVALSET",
    "Completion",
    "EvalItem",
    "QualityReport",
    "compare",
    "load",
    "load_evalset",
    "main",
    "measure",
    "replay",
    "save",
]

DEFAULT_EVALSET = Path(__file__).resolve().parent.parent / "workloads" / "quality" / "eval-v1.jsonl"


@dataclasses.dataclass(frozen=True)
class EvalItem:
    """One prompt: chat ``messages`` and, where it has one, the ``answer`` a correct output
    contains (compared case-insensitively)."""

    id: str
    messages: tuple[Mapping[str, str], ...]
    answer: str | None = None


@dataclasses.dataclass(frozen=True)
class Completion:
    """One greedy output: its text, its tokens with their logprobs, and at each position the
    server's top alternatives (token → logprob)."""

    id: str
    text: str
    tokens: tuple[str, ...]
    logprobs: tuple[float, ...]
    top: tuple[Mapping[str, float], ...]
    finish_reason: str | None = None


@dataclasses.dataclass(frozen=True)
class QualityReport:
    """Candidate against baseline over the same eval items (module docstring)."""

    n: int
    exact_match: float
    diverged: int
    first_diff_mean: float | None
    mean_abs_dlogprob: float | None
    tokens_compared: int
    answer_items: int
    answer_rate_candidate: float | None
    answer_rate_baseline: float | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_evalset(path: Path | str = DEFAULT_EVALSET, limit: int | None = None) -> list[EvalItem]:
    """The eval set: a JSON-lines file of ``{"id", "messages" | "prompt", "answer"?}``."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the eval set {p}: {exc.strerror or exc}") from exc
    items: list[EvalItem] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
            answer = row.get("answer")
            items.append(
                EvalItem(
                    str(row.get("id", n)), tuple(messages), None if answer is None else str(answer)
                )
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{p}:{n}: not an eval item ({exc})") from exc
    if not items:
        raise ConfigError(f"the eval set {p} is empty")
    return items[:limit] if limit else items


def _parse(item_id: str, body: Mapping[str, Any]) -> Completion:
    choice = body["choices"][0]
    content = (choice.get("logprobs") or {}).get("content") or []
    return Completion(
        id=item_id,
        text=str(choice["message"].get("content") or ""),
        tokens=tuple(str(t["token"]) for t in content),
        logprobs=tuple(float(t["logprob"]) for t in content),
        top=tuple(
            {str(a["token"]): float(a["logprob"]) for a in t.get("top_logprobs") or []}
            for t in content
        ),
        finish_reason=choice.get("finish_reason"),
    )


async def _model(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(f"{base_url}/v1/models") as resp:
        resp.raise_for_status()
        return str((await resp.json())["data"][0]["id"])


async def replay(
    base_url: str,
    items: Sequence[EvalItem],
    *,
    model: str | None = None,
    max_tokens: int = 64,
    top_logprobs: int = 5,
    concurrency: int = 32,
    timeout_s: float = 120.0,
    api_key: str | None = None,
) -> list[Completion]:
    """Every item on ``base_url`` greedily (temperature 0, ``max_tokens``, ``logprobs``), at most
    ``concurrency`` in flight; in the items' order. ``model``: the served name (default: the first
    of ``/v1/models``); ``api_key``: sent as a bearer token. Raises :class:`ConfigError` when
    the server cannot be reached or answers a request with an error."""
    base = base_url.rstrip("/")
    limit = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            name = model or await _model(session, base)

            async def one(item: EvalItem) -> Completion:
                payload = {
                    "model": name,
                    "messages": list(item.messages),
                    "temperature": 0.0,
                    "max_tokens": max_tokens,
                    "logprobs": True,
                    "top_logprobs": top_logprobs,
                }
                async with limit, session.post(f"{base}/v1/chat/completions", json=payload) as resp:
                    if resp.status != 200:
                        text = (await resp.text())[:200].replace("\n", " ")
                        raise ConfigError(f"{base}: item {item.id}: HTTP {resp.status}: {text}")
                    return _parse(item.id, await resp.json())

            return list(await asyncio.gather(*(one(i) for i in items)))
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ConfigError(f"{base}: {type(exc).__name__}: {exc}") from exc


def _first_diff(a: Sequence[str], b: Sequence[str]) -> int | None:
    """The first position where the token sequences differ (a length difference counts at the
    shorter one's end), None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _contains(text: str, answer: str) -> bool:
    """``answer`` occurs in ``text`` as a whole word or number, case-insensitively (``7`` is not
    found in ``17`` nor in ``7.5``)."""
    pattern = rf"(?<![\w.]){re.escape(answer.strip())}(?!\w|\.\d)"
    return re.search(pattern, text, re.IGNORECASE) is not None


def compare(
    candidate: Sequence[Completion],
    baseline: Sequence[Completion],
    items: Sequence[EvalItem] | None = None,
) -> QualityReport:
    """The candidate's replay against the baseline's, matched by item id (module docstring).
    ``items``: for the answer rates (None: not computed)."""
    base = {c.id: c for c in baseline}
    pairs = [(c, base[c.id]) for c in candidate if c.id in base]
    if not pairs:
        raise ConfigError("the two replays share no eval item")
    same = 0
    diffs: list[int] = []
    deltas: list[float] = []
    for cand, ref in pairs:
        same += cand.text == ref.text
        at = _first_diff(cand.tokens, ref.tokens)
        prefix = len(ref.tokens) if at is None else at
        deltas.extend(abs(cand.logprobs[i] - ref.logprobs[i]) for i in range(prefix))
        if at is not None:
            diffs.append(at)
            if at < len(ref.tokens) and at < len(cand.top) and ref.tokens[at] in cand.top[at]:
                deltas.append(abs(cand.top[at][ref.tokens[at]] - ref.logprobs[at]))
    answers = {i.id: i.answer for i in items or () if i.answer is not None}
    scored = [(c, r, answers[c.id]) for c, r in pairs if c.id in answers]
    return QualityReport(
        n=len(pairs),
        exact_match=same / len(pairs),
        diverged=len(diffs),
        first_diff_mean=sum(diffs) / len(diffs) if diffs else None,
        mean_abs_dlogprob=sum(deltas) / len(deltas) if deltas else None,
        tokens_compared=len(deltas),
        answer_items=len(scored),
        answer_rate_candidate=(
            sum(_contains(c.text, a) for c, _, a in scored) / len(scored) if scored else None
        ),
        answer_rate_baseline=(
            sum(_contains(r.text, a) for _, r, a in scored) / len(scored) if scored else None
        ),
    )


async def measure(
    candidate_url: str,
    baseline_url: str,
    items: Sequence[EvalItem],
    **replay_args: Any,
) -> QualityReport:
    """Replay ``items`` on both servers (the baseline first) and :func:`compare`."""
    ref = await replay(baseline_url, items, **replay_args)
    cand = await replay(candidate_url, items, **replay_args)
    return compare(cand, ref, items)


def save(completions: Sequence[Completion], path: Path | str, **meta: Any) -> None:
    """A replay as JSON (``meta``: what produced it, e.g. the server's flags)."""
    rows = [dataclasses.asdict(c) for c in completions]
    Path(path).write_text(json.dumps({"meta": meta, "completions": rows}) + "\n", encoding="utf-8")


def load(path: Path | str) -> list[Completion]:
    """A replay :func:`save` wrote."""
    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))["completions"]
        return [
            Completion(
                id=str(r["id"]),
                text=r["text"],
                tokens=tuple(r["tokens"]),
                logprobs=tuple(r["logprobs"]),
                top=tuple(r["top"]),
                finish_reason=r.get("finish_reason"),
            )
            for r in rows
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a saved replay: {exc}") from exc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tuner.quality", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    rp = sub.add_parser("replay", help="replay the eval set on one server; save it as JSON")
    rp.add_argument("url")
    rp.add_argument("out", type=Path)
    rp.add_argument("--tag", default="", help="saved with the replay (e.g. the server's flags)")
    cp = sub.add_parser("compare", help="compare two saved replays: CANDIDATE BASELINE")
    cp.add_argument("candidate", type=Path)
    cp.add_argument("baseline", type=Path)
    ms = sub.add_parser("measure", help="replay on two servers and compare: CANDIDATE BASELINE")
    ms.add_argument("candidate_url")
    ms.add_argument("baseline_url")
    for p in (rp, cp, ms):
        p.add_argument("--evalset", type=Path, default=DEFAULT_EVALSET)
        p.add_argument("--limit", type=int, default=None)
    for p in (rp, ms):
        p.add_argument("--max-tokens", type=int, default=64)
        p.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    try:
        items = load_evalset(args.evalset, args.limit)
        if args.cmd == "replay":
            done = asyncio.run(
                replay(args.url, items, max_tokens=args.max_tokens, concurrency=args.concurrency)
            )
            save(done, args.out, url=args.url, tag=args.tag, max_tokens=args.max_tokens)
            sys.stdout.write(f"{len(done)} completions -> {args.out}\n")
            return 0
        if args.cmd == "compare":
            report = compare(load(args.candidate), load(args.baseline), items)
        else:
            report = asyncio.run(
                measure(
                    args.candidate_url,
                    args.baseline_url,
                    items,
                    max_tokens=args.max_tokens,
                    concurrency=args.concurrency,
                )
            )
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    sys.stdout.write(json.dumps(report.as_dict()) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
