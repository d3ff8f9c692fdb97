"""The compile cache: start-up phases and cache facts from a real vLLM 0.24 log, the simulator's
key grouping (what vLLM hashes), the tuner's predicted key, the index and the warm-first order."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from tuner.compile_cache import (
    INDEX,
    cache_location,
    is_warm,
    predicted_key,
    record,
    user_root,
    warm_first,
)
from tuner.engine.argv import PIN_FLAG, build_argv, cache_root, params_key
from tuner.engine.logparse import parse_facts
from tuner.engine.startup_log import PHASES, startup_facts
from tuner.records import StartupFacts
from tuner.sim.cli import parse_args
from tuner.sim.startup import compile_hashes, compiles, resolve
from tuner.startup import launch_summary, ready_note, summary_line

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "docs/gpu-runs/2026-11-30-h200x2-bench-pinned/call1-gpu0-server.log.gz"
MODEL = str(ROOT / "models/qwen3-8b-dummy")


def _at(hh: int, mm: int, ss: int) -> float:
    return time.mktime((2026, 11, 30, hh, mm, ss, 0, 0, -1))


def test_phases_of_a_real_cold_start() -> None:
    with gzip.open(FIXTURE, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    launched, ready = _at(21, 42, 6), _at(21, 43, 40)
    facts = startup_facts(lines, launched, ready)
    # 21:42:25 first line, :56 EngineCore, :59 loaded, 43:20 compiled, :22 KV, :26 graphs,
    # :38 init engine done
    assert facts.phases == {
        "process": 19.0,
        "api": 31.0,
        "load": 3.0,
        "compile": 21.0,
        "kv": 2.0,
        "graphs": 4.0,
        "warmup": 12.0,
        "ready": 2.0,
    }
    assert tuple(facts.phases) == PHASES
    assert sum(facts.phases.values()) == pytest.approx(ready - launched)
    assert (facts.compile_cache, facts.compile_hash) == ("miss", "e44d0dd376")
    assert facts.aot_hash is not None and facts.aot_hash.startswith("b94117934916")


def test_a_warm_start_and_missing_marks() -> None:
    lines = [
        "(APIServer pid=1) INFO 11-30 21:00:10 [api_utils.py:339] version 0.24.0",
        "(EngineCore pid=2) INFO 11-30 21:00:20 [core.py:114] Initializing a V1 LLM engine",
        "(EngineCore pid=2) INFO 11-30 21:00:22 [decorators.py:312] Directly load AOT "
        "compilation from path /c/torch_compile_cache/torch_aot_compile/abc123/rank_0_0/model",
        "(EngineCore pid=2) INFO 11-30 21:00:23 [monitor.py:53] torch.compile took 1.50 s in total",
        "(EngineCore pid=2) INFO 11-30 21:00:30 [core.py:337] init engine (profile, create kv "
        "cache, warmup model) took 9.0 s (compilation: 1.50 s)",
    ]
    f = startup_facts(lines, _at(21, 0, 9) + 0.5, _at(21, 0, 31))
    # no model-loaded, KV or graphs line: their time counts in the next phase that has a mark
    assert f.phases == {"process": 0.5, "api": 10.0, "compile": 3.0, "warmup": 7.0, "ready": 1.0}
    assert (f.compile_cache, f.compile_hash, f.aot_hash) == ("hit", None, "abc123")
    assert parse_facts(lines[3:4]).compile_s == pytest.approx(1.5)  # "took" (0.24), not "takes"


def _sim_hash(*flags: str) -> str:
    args = parse_args(["serve", MODEL, *flags])
    s = resolve(args, {})
    assert compiles(s, args)
    return compile_hashes(s, "0.24.0")[0]


def test_the_simulator_keys_like_vllm() -> None:
    base = _sim_hash()
    assert _sim_hash("--gpu-memory-utilization", "0.8") == base
    assert _sim_hash("--no-enable-prefix-caching") == base
    assert _sim_hash("--max-num-seqs", "64") != _sim_hash("--max-num-seqs", "128")
    assert _sim_hash("--max-num-seqs", "256") == _sim_hash("--max-num-seqs", "1024") == base
    assert _sim_hash("--block-size", "32") != base
    assert _sim_hash("--max-num-batched-tokens", "4096") != base
    eager = parse_args(["serve", MODEL, "--enforce-eager"])
    assert not compiles(resolve(eager, {}), eager)


def _key(*flags: str) -> str | None:
    return predicted_key(["m", "--port", "1", *flags])


def test_the_predicted_key_groups_as_vllm_does() -> None:
    base = _key()
    assert _key("--gpu-memory-utilization", "0.8", "--no-enable-prefix-caching") == base
    assert _key("--max-num-seqs", "256") == _key("--max-num-seqs", "1024") == base
    assert _key("--max-num-seqs", "64") != _key("--max-num-seqs", "128")
    assert _key("--block-size", "32") != base
    assert _key("--max-num-batched-tokens", "256") != base
    # max_num_batched_tokens caps the capture size: max_num_seqs no longer matters above it
    assert _key("--max-num-batched-tokens", "64", "--max-num-seqs", "64") == _key(
        "--max-num-batched-tokens", "64", "--max-num-seqs", "512"
    )
    assert _key("--max-num-seqs", "64", f"{PIN_FLAG}=512") == _key(
        "--max-num-seqs", "128", f"{PIN_FLAG}=512"
    )
    assert _key("-cc.cudagraph_mode=PIECEWISE") != base
    assert _key("--enforce-eager") is None and _key("-cc.mode=0") is None
    assert predicted_key(["other-model", "--port", "1"]) != base
    # vLLM's compile factors leave these variables out; the others of VLLM_* count
    words = ["m", "--port", "1"]
    assert predicted_key(words, {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}) == base
    assert predicted_key(words, {"VLLM_CACHE_ROOT": "/elsewhere"}) == base
    assert predicted_key(words, {"VLLM_USE_FLASHINFER_SAMPLER": "0"}) != base


def test_cache_root_settings(make_cfg, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_root() == tmp_path / "xdg" / "tuner" / "vllm"
    assert cache_location(None, "vllm", "s") == user_root()
    assert cache_location(None, "sim", "s") is None
    assert cache_location("state", "sim", "s") == Path("s") / "vllm_cache"
    assert cache_location("user", "sim", "s") == user_root()
    assert cache_location("none", "vllm", "s") is None
    assert cache_location("/x/y", "vllm", "s") == Path("/x/y")
    assert cache_root(make_cfg("+workload=chat", "engine.kind=vllm")) == user_root()


def test_pin_capture_size(make_cfg) -> None:
    cfg = make_cfg("+workload=chat", "engine.pin_capture_size=true")
    argv = build_argv(cfg.engine, cfg.model, cfg.space, {"max_num_seqs": 64}, port=1)
    assert f"{PIN_FLAG}=512" in argv
    set_own = build_argv(
        cfg.engine,
        cfg.model,
        cfg.space,
        {},
        port=1,
        server_args={"-cc.max_cudagraph_capture_size": 8},
    )
    assert f"{PIN_FLAG}=512" not in set_own
    assert params_key(cfg, {"max_num_seqs": 64}) == params_key(cfg, {"max_num_seqs": 128})
    off = make_cfg("+workload=chat")
    assert params_key(off, {"max_num_seqs": 64}) != params_key(off, {"max_num_seqs": 128})


def _facts(vllm: str) -> StartupFacts:
    return StartupFacts(compile_cache="miss", compile_hash=vllm, aot_hash="a" + vllm)


def test_index_and_warm_first(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    record(root, "k1", _facts("h1"))
    assert not is_warm(root, "k1")  # indexed, but vLLM's folder is gone (or never was)
    (root / "torch_compile_cache" / "h1").mkdir(parents=True)
    record(root, "k2", _facts("h2"))
    assert is_warm(root, "k1") and not is_warm(root, "k2") and not is_warm(root, "k3")
    assert is_warm(root, None)  # compiles nothing
    assert json.loads((root / INDEX).read_text())["k2"]["vllm"] == "h2"
    assert not list(root.glob("*.tmp"))  # written through a temporary file, replaced
    items = ["k3", "k2", "k1", "k4", "k1b"]
    keys = {"k1b": "k1"}
    assert warm_first(items, lambda x: keys.get(x, x), root) == ["k1", "k1b", "k3", "k2", "k4"]
    assert warm_first(items, lambda x: x, None) == items


def test_summary_of_launches() -> None:
    from tuner.records import LaunchInfo

    def launch(ready: float, cache: str) -> LaunchInfo:
        f = StartupFacts(phases={"process": 1.0, "compile": ready - 1}, compile_cache=cache)
        return LaunchInfo(port=1, pid=1, startup_s=ready, startup=f)

    s = launch_summary([launch(10, "miss"), launch(4, "hit"), launch(6, "hit")], 20.0, 80.0)
    assert s["median_ready_s"] == 6.0 and s["startup_share"] == 0.25
    assert s["median_startup_compile_s"] == 5.0
    assert (s["compile_cache_hits"], s["compile_cache_misses"]) == (2.0, 1.0)
    assert summary_line(s).startswith("Start-up: median ready 6.0 s, 25% of server-held seconds")
    # the simulator's servers: modelled start-ups and cache, said so
    assert summary_line(s, simulated=True).startswith("Start-up (simulated): median ready 6.0 s")


def test_a_launch_on_its_trials_first_line() -> None:
    from dataclasses import replace

    from tuner.records import LaunchInfo

    hit = LaunchInfo(port=1, pid=1, startup_s=57.14, startup=StartupFacts(compile_cache="hit"))
    assert ready_note(hit) == "ready in 57.1 s (compile cache hit), "
    assert ready_note(replace(hit, preloaded=True), simulated=True) == (
        "ready in 57.1 s (simulated compile cache hit), forked from the preloaded interpreter, "
    )
    assert ready_note(LaunchInfo(port=1, pid=1, startup_s=0.5)) == "ready in 0.5 s, "
