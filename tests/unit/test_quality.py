"""tuner.quality: greedy replays of an eval set on two servers, compared prompt by prompt (fake
OpenAI chat servers on loopback), and the shipped eval set."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tuner import quality
from tuner.errors import ConfigError
from tuner.quality import Completion, EvalItem, compare

ROOT = Path(__file__).resolve().parents[2]
Serve = Callable[[web.Application], AbstractAsyncContextManager[str]]

ITEMS = [
    EvalItem("a", ({"role": "user", "content": "What is 2 + 2?"},), "4"),
    EvalItem("b", ({"role": "user", "content": "Capital of France?"},), "Paris"),
    EvalItem("c", ({"role": "user", "content": "Write a line."},)),
]
# the baseline's answers, token by token with their logprobs
BASE = {
    "a": [("It", -0.5), (" is", -0.1), (" 4", -0.2), (".", -0.3)],
    "b": [("Paris", -0.1), (".", -0.2)],
    "c": [("Sun", -1.0), (" rises", -2.0), (" early", -0.5)],
}
# the candidate: "a" the same text with other logprobs; "b" differs at token 0 (the baseline's
# token among its top alternatives); "c" differs at token 2 (" early" not among them)
CAND = {
    "a": [("It", -0.7), (" is", -0.1), (" 4", -0.2), (".", -0.3)],
    "b": [("Lyon", -0.4), (".", -0.2)],
    "c": [("Sun", -1.0), (" rises", -1.5), (" late", -0.9)],
}
CAND_TOP = {("b", 0): {"Lyon": -0.4, "Paris": -0.6}, ("c", 2): {" late": -0.9, " soon": -1.2}}


def chat_app(
    tokens: dict[str, list[tuple[str, float]]],
    top: dict[tuple[str, int], dict[str, float]],
    seen: list[dict[str, Any]],
    model: str = "m",
) -> web.Application:
    """A fake server: answers each item (found by its prompt) with ``tokens`` and logprobs."""
    by_prompt = {i.messages[-1]["content"]: i.id for i in ITEMS}

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": model}]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        if body["model"] != model:
            return web.Response(status=404, text="no such model")
        item = by_prompt[body["messages"][-1]["content"]]
        content = [
            {
                "token": t,
                "logprob": lp,
                "top_logprobs": [
                    {"token": k, "logprob": v} for k, v in top.get((item, i), {t: lp}).items()
                ],
            }
            for i, (t, lp) in enumerate(tokens[item])
        ]
        text = "".join(t for t, _ in tokens[item])
        return web.json_response(
            {
                "choices": [
                    {
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                        "logprobs": {"content": content},
                    }
                ]
            }
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_measure_compares_a_candidate_with_its_baseline(serve_app: Serve) -> None:
    seen: list[dict[str, Any]] = []
    async with (
        serve_app(chat_app(CAND, CAND_TOP, seen)) as cand,
        serve_app(chat_app(BASE, {}, seen)) as base,
    ):
        report = await quality.measure(cand, base, ITEMS, max_tokens=16, top_logprobs=3)
    assert len(seen) == 6
    assert all(
        b["temperature"] == 0.0
        and b["max_tokens"] == 16
        and b["logprobs"] is True
        and b["top_logprobs"] == 3
        and b["model"] == "m"
        for b in seen
    )
    assert report.n == 3
    assert report.exact_match == pytest.approx(1 / 3)  # "a" only
    assert report.diverged == 2
    assert report.first_diff_mean == pytest.approx((0 + 2) / 2)
    # a: 4 tokens |0.2|, 0, 0, 0; b: the baseline's "Paris" among the top: |-0.6 - -0.1|;
    # c: the prefix "Sun", " rises": 0 and 0.5; " early" at the divergence is not in the top
    assert report.tokens_compared == 4 + 1 + 2
    assert report.mean_abs_dlogprob == pytest.approx((0.2 + 0.5 + 0.5) / 7)
    assert (report.answer_items, report.answer_rate_candidate, report.answer_rate_baseline) == (
        2,
        0.5,
        1.0,
    )


async def test_a_server_identical_to_the_baseline_agrees_fully(serve_app: Serve) -> None:
    async with serve_app(chat_app(BASE, {}, [])) as a, serve_app(chat_app(BASE, {}, [])) as b:
        report = await quality.measure(a, b, ITEMS)
    assert (
        report.exact_match,
        report.diverged,
        report.first_diff_mean,
        report.mean_abs_dlogprob,
    ) == (1.0, 0, None, 0.0)


async def test_an_error_answer_or_no_server_is_one_line(serve_app: Serve) -> None:
    async with serve_app(chat_app(BASE, {}, [])) as base:
        with pytest.raises(ConfigError, match="HTTP 404: no such model"):
            await quality.replay(base, ITEMS, model="other")
    with pytest.raises(ConfigError, match="ClientConnectorError|ClientOSError|Cannot connect"):
        await quality.replay(base, ITEMS, timeout_s=5)


def completion(cid: str, tokens: list[str], lps: list[float] | None = None) -> Completion:
    lps = lps or [-1.0] * len(tokens)
    return Completion(cid, "".join(tokens), tuple(tokens), tuple(lps), tuple({} for _ in tokens))


def test_a_length_difference_diverges_at_the_shorter_end() -> None:
    report = compare([completion("x", ["a", "b"])], [completion("x", ["a", "b", "c"])])
    assert (report.exact_match, report.first_diff_mean, report.tokens_compared) == (0.0, 2.0, 2)
    with pytest.raises(ConfigError, match="share no eval item"):
        compare([completion("x", ["a"])], [completion("y", ["a"])])


def test_answers_match_whole_words_and_numbers() -> None:
    contains = quality._contains
    assert contains("1 + 31 = 32", "32") and contains("It is 7.", "7")
    assert not contains("17 apples", "7") and not contains("7.5", "7")
    assert contains("the capital is New Delhi", "new delhi") and not contains("Parisian", "Paris")


def test_saved_replays_compare_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    evalset = tmp_path / "e.jsonl"
    evalset.write_text('{"id": "x", "prompt": "Say ab.", "answer": "ab"}\n')
    quality.save([completion("x", ["a", "b"], [-0.1, -0.2])], tmp_path / "base.json", tag="")
    quality.save([completion("x", ["a", "c"], [-0.3, -0.2])], tmp_path / "cand.json", tag="fp8")
    assert quality.load(tmp_path / "cand.json")[0].tokens == ("a", "c")
    code = quality.main(
        [
            "compare",
            str(tmp_path / "cand.json"),
            str(tmp_path / "base.json"),
            "--evalset",
            str(evalset),
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (
        out["exact_match"],
        out["first_diff_mean"],
        out["answer_rate_candidate"],
        out["answer_rate_baseline"],
    ) == (0.0, 1.0, 0.0, 1.0)
    assert out["mean_abs_dlogprob"] == pytest.approx(0.2)
    assert (
        quality.main(
            ["compare", str(evalset), str(tmp_path / "base.json"), "--evalset", str(evalset)]
        )
        == 2
    )
    assert "is not a saved replay" in capsys.readouterr().err


def test_the_shipped_eval_set_is_the_scripts_output_with_correct_answers() -> None:
    spec = importlib.util.spec_from_file_location(
        "make_evalset", ROOT / "scripts" / "make_quality_evalset.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rows = script.items()
    assert quality.DEFAULT_EVALSET.read_text() == "".join(json.dumps(r) + "\n" for r in rows)
    items = quality.load_evalset()
    assert len(items) == len({i.id for i in items}) >= 250
    arithmetic = 0
    for item in items:
        prompt = item.messages[-1]["content"]
        if m := re.match(r"What is (\d+) ([-+]|times) (\d+)\?", prompt):
            a, op, b = int(m[1]), m[2], int(m[3])
            assert item.answer == str({"+": a + b, "-": a - b, "times": a * b}[op])
            arithmetic += 1
        elif m := re.match(r"Tom has (\d+) boxes with (\d+) apples .* eats (\d+) apples", prompt):
            assert item.answer == str(int(m[1]) * int(m[2]) - int(m[3]))
            arithmetic += 1
    assert arithmetic == 140
    assert quality.load_evalset(limit=5) == items[:5]


def test_a_bad_eval_set_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the eval set"):
        quality.load_evalset(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: not an eval item"):
        quality.load_evalset(bad)
