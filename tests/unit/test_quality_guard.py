"""The confirm stage's quality guard (tuner.quality_guard): which flags change numerics, the gate
and its default bound against the H200's measurements, the record a candidate gets (measured,
dummy weights, off, unmeasured), the verdict's line, the config check; and the simulated model's
greedy outputs it runs on in CI (tuner.sim.answers)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from optuna.trial import FrozenTrial, create_trial

from tuner import quality_guard
from tuner.artifacts import TrialFolder
from tuner.config import ConfirmConfig, TunerConfig
from tuner.errors import ConfigError
from tuner.quality import Completion, QualityReport, load_evalset, save
from tuner.quality_guard import DUMMY, Guard, agreement, gate, note
from tuner.records import Candidate, ConfirmResult
from tuner.sim import answers
from tuner.space import numerics_flags, numerics_params, real_weights_only
from tuner.verdict import Verdict, line
from tuner.vllm_rules import numerics_changes

Serve = Callable[[web.Application], AbstractAsyncContextManager[str]]
REAL = ("+workload=chat", "model.load_format=null")  # the simulator, as if the weights were real
NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'


def report(exact: float, cand: float | None, base: float | None) -> QualityReport:
    return QualityReport(280, exact, 0, None, None, 0, 200, cand, base)


# --- which flags change numerics ----------------------------------------------------------------


def test_the_flags_that_change_numerics_are_one_list() -> None:
    assert numerics_changes(
        {
            "--kv-cache-dtype": "fp8",
            "quantization": "fp8",
            "dtype": "auto",
            "speculative_config": NGRAM,
            "max_num_seqs": 64,
        }
    ) == {"kv_cache_dtype": "fp8", "quantization": "fp8", "speculative_config": NGRAM}
    assert numerics_changes({"kv_cache_dtype": "auto", "quantization": None, "dtype": "auto"}) == {}


def test_the_space_names_params_that_change_numerics(make_cfg: Callable[..., TunerConfig]) -> None:
    cfg = make_cfg(*REAL, "space=ngram")
    assert numerics_flags(cfg.space) == ["kv_cache_dtype", "quantization", "speculative_config"]
    params = {"kv_cache_dtype": "fp8", "speculative_config": None, "block_size": 32}
    assert numerics_params(cfg.space, params) == {"kv_cache_dtype": "fp8"}
    assert numerics_params(cfg.space, {"kv_cache_dtype": "auto"}) == {}


def test_speculative_decoding_is_searched_on_real_weights_only(
    make_cfg: Callable[..., TunerConfig], caplog: pytest.LogCaptureFixture
) -> None:
    assert make_cfg(*REAL, "space=ngram").space.params["speculative_config"].enabled
    cfg = make_cfg("+workload=chat", "space=ngram")  # qwen3-8b: dummy weights
    assert cfg.model.dummy_weights
    assert not cfg.space.params["speculative_config"].enabled
    cfg.space.params["speculative_config"].enabled = True
    with caplog.at_level("INFO"):
        assert real_weights_only(cfg.space, cfg.model) == ["speculative_config"]
    assert "speculative_config not searched" in caplog.text and "dummy weights" in caplog.text


# --- the gate -----------------------------------------------------------------------------------


def test_the_default_bound_against_the_h200_measurements() -> None:
    """docs/gpu-runs/2026-12-02-quality.md: bf16 against bf16 and n-gram speculation agreed
    exactly; the fp8 KV cache kept 0.390 of 0.405, fp8 weights 0.405; the collapse users report
    (vllm-project/vllm#19292: GSM8K 0.78 -> 0.03) must be caught."""
    bound = ConfirmConfig().quality.min_agreement
    assert ConfirmConfig().quality.measure == "answer_rate"
    measured = {
        "bf16": report(1.0, 0.405, 0.405),
        "kv_fp8": report(0.314, 0.390, 0.405),
        "q_fp8": report(0.254, 0.405, 0.405),
        "collapse": report(0.0, 0.03, 0.78),
    }
    held = {k: gate([agreement(r, "answer_rate")], bound)[1] for k, r in measured.items()}
    assert held == {"bf16": True, "kv_fp8": True, "q_fp8": True, "collapse": False}
    # exact match at the same bound would demote both fp8 configs that answered as well
    assert not gate([agreement(measured["kv_fp8"], "exact_match")], bound)[1]


def test_the_worst_round_decides_and_nothing_measured_fails() -> None:
    assert gate([0.95, None, 0.85], 0.9) == (0.85, False)
    assert gate([0.95, 0.92], 0.9) == (0.92, True)
    assert gate([None], 0.9) == (None, False)
    assert agreement(report(0.5, 0.0, 0.0), "answer_rate") is None  # no answer to lose
    assert agreement(report(0.5, None, None), "answer_rate") is None
    assert agreement(report(0.5, 0.0, 0.0), "exact_match") == 0.5


# --- a candidate's record -----------------------------------------------------------------------


def candidates() -> list[Candidate]:
    return [
        Candidate(0, ("baseline",), {"kv_cache_dtype": "auto"}, True, (), {}),
        Candidate(1, ("goodput",), {"kv_cache_dtype": "fp8"}, False, (), {}),
        Candidate(2, ("latency",), {"block_size": 32}, False, (), {}),
    ]


def held(trial: int) -> ConfirmResult:
    return ConfirmResult(trial, (), {}, True, None, {}, {})


def sim_replay(flags: dict[str, Any], limit: int, loss: float = 0.0) -> list[Completion]:
    """What the simulated server answers the eval set's first ``limit`` items with ``flags``."""
    out = []
    for item in load_evalset(limit=limit):
        o = answers.output(answers.prompt_text(item.messages), 64, flags, loss=loss)
        out.append(Completion(item.id, o.text, o.tokens, o.logprobs, o.top))
    return out


@pytest.mark.parametrize(
    ("overrides", "loss", "passed", "status"),
    [
        ((), 0.0, True, "measured"),  # the answers kept: passes the default measure
        ((), 1.0, False, "measured"),  # every changed output loses its answer
        (("confirm.quality.measure=exact_match",), 0.0, False, "measured"),
    ],
)
def test_a_pick_that_changes_numerics_is_judged_against_the_defaults_of_each_round(
    make_cfg: Callable[..., TunerConfig],
    overrides: tuple[str, ...],
    loss: float,
    passed: bool,
    status: str,
) -> None:
    cfg = make_cfg(*REAL, "confirm.quality.limit=120", *overrides)
    guard = Guard(cfg, candidates())
    assert guard.measures and [c.trial for c in guard.guarded] == [1]
    assert guard.hook(candidates()[2], 1) is None  # changes nothing: no eval replay
    for rnd in (1, 2):
        guard.replays[(0, rnd)] = sim_replay({}, 120)
        guard.replays[(1, rnd)] = sim_replay({"kv_cache_dtype": "fp8"}, 120, loss)
    assert guard.judge(held(2), candidates()[2], 2) == held(2)  # not guarded: unchanged
    got = guard.judge(held(1), candidates()[1], 2)
    q = got.quality or {}
    assert (got.passed, q["status"], q["passed"]) == (passed, status, passed)
    assert q["changes"] == ["kv_cache_dtype=fp8"] and len(q["rounds"]) == 2
    assert 0.5 < q["rounds"][0]["diverged"] / 120 < 0.85  # the simulator's 69 %
    if passed:
        assert got.reason is None and q["agreement"] >= 0.9
    else:
        assert got.reason is not None and got.reason.startswith("quality: ")
        assert "below confirm.quality.min_agreement 0.90" in got.reason


def test_a_round_without_both_replays_demotes_on_real_weights(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    guard = Guard(make_cfg(*REAL), candidates())
    guard.replays[(0, 1)] = "http://127.0.0.1:1: ClientConnectorError"
    guard.replays[(1, 1)] = sim_replay({"kv_cache_dtype": "fp8"}, 10)
    got = guard.judge(held(1), candidates()[1], 1)
    assert not got.passed and (got.quality or {})["status"] == "unmeasured"
    assert "quality not measured (http://127.0.0.1:1: ClientConnectorError)" in (got.reason or "")
    alone = Guard(make_cfg(*REAL), candidates()[1:])  # no baseline candidate
    assert "not among the confirm candidates" in (
        alone.judge(held(1), candidates()[1], 1).reason or ""
    )


def test_a_screened_lever_is_judged_on_every_pair_of_its_servers_and_the_defaults(
    make_cfg: Callable[..., TunerConfig], tmp_path: Path
) -> None:
    """mode=screen: each server's eval replay lies in its trial folder (quality.json); a lever's
    record compares every lever server with every defaults' server, the worst pair decides, and
    a folder not on this machine (a report elsewhere) leaves it unmeasured, never passed."""
    cfg = make_cfg(*REAL, "mode=screen", "confirm.quality.limit=120")

    def server(number: int, flags: dict[str, Any], loss: float) -> FrozenTrial:
        d = tmp_path / f"trial_{number:04d}"
        d.mkdir()
        save(sim_replay(flags, 120, loss), TrialFolder(d).quality)
        t = create_trial(value=1.0, user_attrs={"trial_dir": str(d)})
        t.number = number
        return t

    fp8 = {"kv_cache_dtype": "fp8"}
    defaults = [server(0, {}, 0.0), server(2, {}, 0.0)]
    kept, lost = server(1, fp8, 0.0), server(3, fp8, 1.0)
    q = quality_guard.screen_quality(cfg, ["kv_cache_dtype=fp8"], [kept, lost], defaults)
    assert q["status"] == "measured" and len(q["rounds"]) == 4
    assert [r["round"] for r in q["rounds"]][:2] == ["trial 1 vs 0", "trial 1 vs 2"]
    assert [r["agreement"] for r in q["rounds"]][:2] == [1.0, 1.0]  # answers kept
    assert q["agreement"] < 0.9 and not q["passed"]  # the server that lost them decides
    assert quality_guard.screen_quality(cfg, [], [kept], defaults)["passed"]
    elsewhere = create_trial(value=1.0, user_attrs={"trial_dir": str(tmp_path / "gone")})
    away = quality_guard.screen_quality(cfg, [], [elsewhere], defaults)
    assert away["status"] == "unmeasured" and not away["passed"] and "trial folders" in away["why"]
    dummy = make_cfg("+workload=chat", "mode=screen")
    assert quality_guard.screen_quality(dummy, [], [kept], defaults)["status"] == "dummy"
    # which servers replay: the defaults' and a lever that changes numerics, on real weights
    hook = quality_guard.screen_hook
    assert hook(cfg, {}, True, tmp_path) is not None
    assert hook(cfg, fp8, False, tmp_path) is not None
    assert hook(cfg, {"block_size": 32}, False, tmp_path) is None
    assert hook(dummy, fp8, False, tmp_path) is None
    assert hook(make_cfg(*REAL), fp8, False, tmp_path) is None  # a search: the confirm's guard


def test_dummy_weights_and_a_guard_turned_off_say_so_and_replay_nothing(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    dummy = Guard(make_cfg("+workload=chat"), candidates())  # qwen3-8b: load_format dummy
    assert not dummy.measures and dummy.hook(candidates()[1], 1) is None
    assert DUMMY in (dummy.intro() or "")
    results = [held(0), dummy.judge(held(1), candidates()[1], 3), held(2)]
    assert results[1].passed and (results[1].quality or {})["status"] == "dummy"
    assert note(results) == f"{DUMMY} (trial 1 changes numerics)"
    off = Guard(make_cfg(*REAL, "confirm.quality.enabled=false"), candidates())
    assert not off.measures and "confirm.quality.enabled=false" in (off.intro() or "")
    judged = off.judge(held(1), candidates()[1], 3)
    assert judged.passed and "enabled=false" in (note([judged]) or "")
    assert note([held(0), held(2)]) is None  # nothing changes numerics: nothing to say


def test_the_verdict_line_carries_the_guard_with_every_kind() -> None:
    v = Verdict("gain", "goodput", True, 1, 1, 0, 3, 0.03, quality="trial 1 quality: x")
    assert line(v).endswith("→ gain: trial 1 [trial 1 quality: x]")
    back = Verdict.from_dict(v.as_dict())
    assert back.quality == v.quality
    old = {k: x for k, x in v.as_dict().items() if k != "quality"}  # stored before the guard
    assert Verdict.from_dict(old).quality is None


async def test_the_hook_replays_the_eval_set_on_the_server_with_its_key(
    make_cfg: Callable[..., TunerConfig], serve_app: Serve
) -> None:
    seen: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.Response:
        assert request.headers.get("Authorization") == "Bearer sk-k"
        body = await request.json()
        seen.append(body)
        o = answers.output(answers.prompt_text(body["messages"]), body["max_tokens"], {})
        choice = {
            "message": {"content": o.text},
            "logprobs": o.chat_logprobs(body["top_logprobs"]),
            "finish_reason": "length",
        }
        return web.json_response({"choices": [choice]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    cfg = make_cfg(*REAL, "confirm.quality.limit=5", "engine.extra_args=[--api-key,sk-k]")
    guard = Guard(cfg, candidates())
    after = guard.hook(candidates()[0], 2)
    assert after is not None
    async with serve_app(app) as base:
        await after(base)
    got = guard.replays[(0, 2)]
    assert isinstance(got, list) and len(got) == 5 and len(seen) == 5
    assert {(b["temperature"], b["max_tokens"], b["model"]) for b in seen} == {(0.0, 64, "m")}
    assert got[0].tokens and len(got[0].top[0]) == 5


async def test_a_failed_eval_replay_is_recorded_not_raised(
    make_cfg: Callable[..., TunerConfig], serve_app: Serve
) -> None:
    async def chat(_: web.Request) -> web.Response:
        return web.json_response({"choices": []})  # not an answer

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    guard = Guard(make_cfg(*REAL, "confirm.quality.limit=2"), candidates())
    after = guard.hook(candidates()[1], 1)
    assert after is not None
    async with serve_app(app) as base:
        await after(base)
    assert str(guard.replays[(1, 1)]).startswith("a bad answer: IndexError")
    await after("http://127.0.0.1:1")  # nothing listens
    assert "http://127.0.0.1:1" in str(guard.replays[(1, 1)])


# --- the config check ---------------------------------------------------------------------------


def test_a_guard_without_the_baseline_pick_is_one_line_before_the_study(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    with pytest.raises(ConfigError, match="confirm.picks has no baseline") as err:
        make_cfg(*REAL, "confirm.picks=[goodput]")
    assert "\n" not in str(err.value) and "confirm.quality.enabled=false" in str(err.value)
    make_cfg(*REAL, "confirm.picks=[goodput]", "confirm.quality.enabled=false")
    make_cfg("+workload=chat", "confirm.picks=[goodput]")  # dummy weights: nothing to compare
    make_cfg(*REAL, "space=none", "confirm.picks=[goodput]")  # nothing changes numerics
    with pytest.raises(ConfigError, match="confirm.quality.min_agreement is 1.5"):
        make_cfg(*REAL, "confirm.quality.min_agreement=1.5")
    with pytest.raises(ConfigError, match="confirm.quality.measure"):
        make_cfg(*REAL, "confirm.quality.measure=bleu")


def test_check_is_among_the_config_checks() -> None:
    from tuner.checks import CHECKS

    assert quality_guard.check in CHECKS


# --- the simulated model ------------------------------------------------------------------------


def test_the_simulated_model_is_deterministic_and_its_numerics_move_as_measured() -> None:
    prompts = list(answers.known_answers())
    assert len(prompts) >= 150
    same = [answers.output(p, 64, {}) for p in prompts]
    assert same == [answers.output(p, 64, {}) for p in prompts]  # greedy: the same text
    assert len({o.text for o in same}) > len(prompts) // 2  # and prompts differ
    known = sum(answers.known_answers()[p] in o.text for p, o in zip(prompts, same, strict=True))
    assert 0.3 < known / len(prompts) < 0.5  # ANSWER_RATE 0.405
    for flags, share in (
        ({"kv_cache_dtype": "fp8"}, 0.69),
        ({"quantization": "fp8"}, 0.75),
        ({"speculative_config": NGRAM}, 0.0),
        ({"kv_cache_dtype": "auto", "dtype": "auto"}, 0.0),
    ):
        changed = [answers.output(p, 64, flags) for p in prompts]
        differ = sum(a.text != b.text for a, b in zip(changed, same, strict=True)) / len(prompts)
        assert abs(differ - share) < 0.08, (flags, differ)
        assert changed == [answers.output(p, 64, flags) for p in prompts]
    assert answers.diverge_share({"kv_cache_dtype": "fp8", "quantization": "fp8"}) == (
        pytest.approx(1 - 0.31 * 0.25)
    )


def test_the_simulated_model_scores_its_tokens() -> None:
    o = answers.output("What is 1 + 31? Reply with the number only.", 8, {})
    assert len(o.tokens) == len(o.logprobs) == len(o.top) == 8
    assert all(-2.0 <= lp <= 0 for lp in o.logprobs)
    assert all(next(iter(top)) == t for t, top in zip(o.tokens, o.top, strict=True))
    chat = o.chat_logprobs(3)["content"]
    assert [c["token"] for c in chat] == list(o.tokens)
    assert all(len(c["top_logprobs"]) == 3 for c in chat)
    short = answers.output("What is 1 + 31? Reply with the number only.", 2, {"dtype": "half"})
    assert len(short.tokens) == 2


def test_the_simulated_speculation_counts_drafts_at_the_h200_acceptance() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from tuner.telemetry.prom import parse_metrics

    reg = CollectorRegistry()
    spec = answers.SpecDecodeMetrics(
        reg, {"model_name": "m", "engine": "0"}, {"num_speculative_tokens": 4}
    )
    spec.update(1000)
    spec.update(900)  # a total never goes back
    got = parse_metrics(generate_latest(reg).decode())
    drafted = got["vllm:spec_decode_num_draft_tokens_total"]
    assert got["vllm:spec_decode_num_accepted_tokens_total"] / drafted == pytest.approx(0.387)
    # each step: 1 token of its own plus the accepted drafts
    steps = got["vllm:spec_decode_num_drafts_total"]
    assert drafted == pytest.approx(4 * steps) and steps * (1 + 4 * 0.387) == pytest.approx(1000)
