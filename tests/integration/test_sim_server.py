"""The simulated ``vllm serve`` as a real subprocess: logs, HTTP API, metrics, death and shutdown."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from helpers.procs import sim_argv
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from tuner.config import TraceConfig, WorkloadConfig
from tuner.memory import GPU_PROFILES, ModelShape, estimate
from tuner.replay import replay
from tuner.workload import build_requests, load_trace

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MODEL = "models/qwen-0.5b-dummy"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sim:
    """One simulator process in its own session; its output is collected line by line."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            sim_argv(MODEL, self.port, *flags),
            cwd=ROOT,
            env={**os.environ, "TUNER_SIM_SPEEDUP": "200", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def engine_pid(self) -> int:
        m = re.search(r"\(EngineCore pid=(\d+)\)", self.log)
        assert m, self.log
        return int(m.group(1))

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log
            if "Application startup complete." in self.log:
                return
            time.sleep(0.02)
        raise AssertionError("not ready:\n" + self.log)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._reader.join(timeout=2)


@pytest.fixture
def make_sim() -> Iterator[Any]:
    sims: list[Sim] = []

    def factory(*flags: str, env: dict[str, str] | None = None, ready: bool = True) -> Sim:
        sim = Sim(*flags, env=env)
        sims.append(sim)
        if ready:
            sim.wait_ready()
        return sim

    try:
        yield factory
    finally:
        for sim in sims:
            sim.kill()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(ROOT / MODEL / "tokenizer.json"))


async def sse(resp: aiohttp.ClientResponse) -> list[Any]:
    """Parse an SSE body into JSON objects, ``"[DONE]"`` kept as a string."""
    events: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


LINE = re.compile(r"^\((APIServer|EngineCore) pid=\d+\) (INFO|WARNING|ERROR) \d\d-\d\d "
                  r"\d\d:\d\d:\d\d \[[\w.]+:\d+\] ")  # fmt: skip


async def test_startup_log_and_basic_endpoints(make_sim: Any, http: aiohttp.ClientSession) -> None:
    t0 = time.monotonic()
    sim = make_sim()
    assert time.monotonic() - t0 < 5
    log = sim.log
    order = [
        "vLLM API server version 0.24.0",
        "non-default args: {",
        "Using max model len 32768",
        "Model loading took ",
        "Available KV cache memory: ",
        "GPU KV cache size: ",
        "Maximum concurrency for 32,768 tokens per request: ",
        "Graph capturing finished in ",
        "init engine (profile, create kv cache, warmup model) took ",
        f"Starting vLLM server on http://127.0.0.1:{sim.port}",
        "Application startup complete.",
    ]
    positions = [log.index(s) for s in order]
    assert positions == sorted(positions)
    for line in sim.lines:
        assert LINE.match(line), line
    kv = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", log).group(1).replace(",", ""))  # type: ignore[union-attr]
    shape = ModelShape.from_dir(ROOT / MODEL)
    assert kv == estimate(shape, GPU_PROFILES["h200"], {}).kv_tokens
    conc = float(re.search(r"per request: ([\d.]+)x", log).group(1))  # type: ignore[union-attr]
    assert conc == pytest.approx(kv / 32768, abs=0.01)
    assert re.search(r"Model loading took [\d.]+ GiB memory and [\d.]+ seconds", log)
    assert re.search(r"init engine .* took [\d.]+ s \(compilation: [\d.]+ s\)", log)

    async with http.get(sim.url + "/health") as r:
        assert r.status == 200
    async with http.get(sim.url + "/version") as r:
        assert (await r.json())["version"] == "0.24.0"
    async with http.get(sim.url + "/v1/models") as r:
        body = await r.json()
    assert body["object"] == "list"
    assert body["data"][0]["id"] == "m" and body["data"][0]["max_model_len"] == 32768


def test_eager_has_no_graph_line(make_sim: Any) -> None:
    sim = make_sim("--enforce-eager", "--max-model-len", "4096")
    assert "Graph capturing finished" not in sim.log
    assert "Using max model len 4096" in sim.log


def test_port_closed_until_ready(make_sim: Any) -> None:
    sim = make_sim(env={"TUNER_SIM_STARTUP_S": "1.5"}, ready=False)
    deadline = time.monotonic() + 10
    while "Model loading took" not in sim.log:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", sim.port), timeout=1):
        pass
    sim.wait_ready()
    with socket.create_connection(("127.0.0.1", sim.port), timeout=1):
        pass


async def test_streaming_completion_with_usage(make_sim: Any, http: aiohttp.ClientSession) -> None:
    sim = make_sim()
    prompt = "The quick brown fox jumps over the lazy dog. " * 5
    body = {"model": "m", "prompt": prompt, "max_tokens": 12, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with http.post(sim.url + "/v1/completions", json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = await sse(r)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == []
    content = [e for e in events[:-2]]
    assert len(content) == 12
    assert all(e["choices"][0]["text"] for e in content)
    assert [e["choices"][0]["finish_reason"] for e in content] == [None] * 11 + ["length"]
    n_prompt = len(tokenizer().encode(prompt).ids)
    assert usage["usage"] == {**usage["usage"], "prompt_tokens": n_prompt,
                              "completion_tokens": 12, "total_tokens": n_prompt + 12}  # fmt: skip


async def test_stream_interval_bundles_tokens(make_sim: Any, http: aiohttp.ClientSession) -> None:
    sim = make_sim("--stream-interval", "4")
    body = {"model": "m", "prompt": "hello", "max_tokens": 9, "stream": True}
    async with http.post(sim.url + "/v1/completions", json=body) as r:
        events = await sse(r)
    assert events[-1] == "[DONE]"
    assert len(events) - 1 == 3  # first token alone, then 4, then the last 4


async def test_stream_ms_bundles_tokens_by_time(make_sim: Any, http: aiohttp.ClientSession) -> None:
    # TUNER_SIM_STREAM_MS longer than the whole request: the first token alone, then the rest
    sim = make_sim(env={"TUNER_SIM_STREAM_MS": "1000"})
    body = {"model": "m", "prompt": "hello", "max_tokens": 9, "stream": True}
    async with http.post(sim.url + "/v1/completions", json=body) as r:
        events = await sse(r)
    assert events[-1] == "[DONE]"
    texts = [e["choices"][0]["text"] for e in events[:-1]]
    assert [t.count(" ") for t in texts] == [1, 8]


async def test_streaming_chat_with_usage(make_sim: Any, http: aiohttp.ClientSession) -> None:
    sim = make_sim()
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": "Count to three."}]}]  # fmt: skip
    body = {"model": "m", "messages": messages, "max_completion_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with http.post(sim.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        events = await sse(r)
    assert events[-1] == "[DONE]"
    first = events[0]["choices"][0]
    assert first["delta"]["role"] == "assistant" and not first["delta"].get("content")
    content = events[1:-2]
    assert len(content) == 5 and all(e["object"] == "chat.completion.chunk" for e in content)
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    chatml = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nCount to three.<|im_end|>\n<|im_start|>assistant\n"
    )
    n_prompt = len(tokenizer().encode(chatml, add_special_tokens=False).ids)
    usage = events[-2]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (n_prompt, 5)


async def test_a_trace_row_reaches_the_server_at_its_input_tokens(make_sim: Any) -> None:
    """A trace counts the whole prompt: the server's usage (the streamed final chunk, as the
    replay client records it) must show the row's input tokens, chat template included."""
    sim = make_sim()
    trace = TraceConfig(
        path=str(ROOT / "workloads" / "traces" / "guidellm_sample.csv"), limit=6, time_scale=0.01
    )
    w = WorkloadConfig(
        name="t", corpus=str(ROOT / "workloads" / "corpus.txt.gz"), trace=trace, warmup_requests=0
    )
    assert w.endpoint == "chat"
    specs = build_requests(w, ROOT / MODEL)
    records = await replay(sim.url, "m", specs, w.arrival, duration_s=60, request_timeout_s=30)
    rows = load_trace(trace).input_tokens.tolist()
    assert [r.status for r in records] == ["ok"] * len(rows)
    assert [r.prompt_tokens for r in records] == rows
    assert [s.prompt_tokens for s in specs] == rows  # what the tuner expects the server to count


async def test_non_streaming_and_errors(make_sim: Any, http: aiohttp.ClientSession) -> None:
    sim = make_sim("--max-model-len", "2048", "--api-key", "sekret")
    auth = {"Authorization": "Bearer sekret"}
    body = {"model": "m", "prompt": "hi there", "max_tokens": 7}
    async with http.post(sim.url + "/v1/completions", json=body) as r:
        assert r.status == 401
    async with http.post(sim.url + "/v1/completions", json=body, headers=auth) as r:
        assert r.status == 200
        out = await r.json()
    assert out["usage"]["completion_tokens"] == 7
    assert out["choices"][0]["finish_reason"] == "length"
    async with http.post(
        sim.url + "/v1/completions", json={**body, "model": "other"}, headers=auth
    ) as r:
        assert r.status == 404
    n_prompt = len(tokenizer().encode("hi there").ids)
    async with http.post(
        sim.url + "/v1/completions", json={**body, "max_tokens": 2048}, headers=auth
    ) as r:
        assert r.status == 400
        err = (await r.json())["error"]["message"]
    assert err == (
        f"This model's maximum context length is 2048 tokens. However, you requested 2048 "
        f"output tokens and your prompt contains {n_prompt} input tokens, for a total of "
        f"{2048 + n_prompt} tokens. Please reduce the length of the input prompt or the number "
        "of requested output tokens."
    )
    async with http.get(sim.url + "/health") as r:
        assert r.status == 200  # /health is not behind the API key


def _png(width: int, height: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def test_images(make_sim: Any, http: aiohttp.ClientSession) -> None:
    sim = make_sim("--limit-mm-per-prompt.image", "1")

    def body(*urls: str) -> dict[str, Any]:
        parts: list[dict[str, Any]] = [{"type": "text", "text": "describe"}]
        parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
        return {"model": "m", "messages": [{"role": "user", "content": parts}], "max_tokens": 2}

    async with http.post(sim.url + "/v1/chat/completions", json=body()) as r:
        text_only = (await r.json())["usage"]["prompt_tokens"]
    async with http.post(sim.url + "/v1/chat/completions", json=body(_png(56, 60))) as r:
        assert r.status == 200
        with_image = (await r.json())["usage"]["prompt_tokens"]
    assert with_image - text_only == 2 * 3  # ceil(56/28) x ceil(60/28)
    async with http.post(
        sim.url + "/v1/chat/completions", json=body(_png(28, 28), _png(28, 28))
    ) as r:
        assert r.status == 400
        assert "At most 1 image(s) may be provided in one prompt." in await r.text()
    async with http.post(
        sim.url + "/v1/chat/completions", json=body("https://example.com/a.png")
    ) as r:
        assert r.status == 400
        assert "Only base64 data URLs are supported for now." in await r.text()


def metric_samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def test_metrics_and_preemptions(make_sim: Any, http: aiohttp.ClientSession) -> None:
    # 48 blocks x 16 = 768 KV tokens for 16 requests of ~200 + 100 tokens: preemptions must occur.
    sim = make_sim("--num-gpu-blocks-override", "48", "--max-model-len", "768",
                   "--no-enable-prefix-caching")  # fmt: skip

    async def one(i: int) -> None:
        body = {"model": "m", "prompt": [i * 1000 + k for k in range(200)], "max_tokens": 100,
                "ignore_eos": True}  # fmt: skip
        async with http.post(sim.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            assert (await r.json())["usage"]["completion_tokens"] == 100

    await asyncio.gather(*(one(i) for i in range(16)))
    async with http.get(sim.url + "/metrics") as r:
        text = await r.text()
    samples = metric_samples(text)
    names = {fam.name for fam in text_string_to_metric_families(text)}
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:cache_config_info",
        "tuner_sim:stream_lag_seconds",
    ]:
        assert name in names, name
    assert samples["tuner_sim:stream_lag_seconds_count"] == 16  # one chunk each (not streamed)
    assert samples["vllm:num_preemptions_total"] > 0
    assert samples["vllm:generation_tokens_total"] == 1600
    assert samples["vllm:prompt_tokens_total"] == 3200
    assert samples["vllm:request_success_total"] == 16
    assert samples["vllm:time_to_first_token_seconds_count"] == 16
    assert samples["vllm:num_requests_running"] == 0
    assert 0 <= samples["vllm:kv_cache_usage_perc"] <= 1
    assert 'finished_reason="length"' in text and 'engine="0"' in text


async def test_prefix_cache_metrics(make_sim: Any, http: aiohttp.ClientSession) -> None:
    sim = make_sim()
    prompt = list(range(5000, 5000 + 160))
    for _ in range(2):
        body = {"model": "m", "prompt": prompt, "max_tokens": 2}
        async with http.post(sim.url + "/v1/completions", json=body) as r:
            assert r.status == 200
    async with http.get(sim.url + "/metrics") as r:
        samples = metric_samples(await r.text())
    assert samples["vllm:prefix_cache_queries_total"] == 320
    assert samples["vllm:prefix_cache_hits_total"] == 144  # 9 full blocks; the last is recomputed


async def test_reset_prefix_cache_only_in_dev_mode(
    make_sim: Any, http: aiohttp.ClientSession
) -> None:
    """As vLLM: the cache-reset routes exist with VLLM_SERVER_DEV_MODE=1; after a reset the same
    prompt finds nothing cached."""
    plain = make_sim()
    async with http.post(plain.url + "/reset_prefix_cache") as r:
        assert r.status == 404
    sim = make_sim(env={"VLLM_SERVER_DEV_MODE": "1"})
    prompt = list(range(7000, 7000 + 160))
    body = {"model": "m", "prompt": prompt, "max_tokens": 2}

    async def hits() -> float:
        async with http.get(sim.url + "/metrics") as r:
            return float(metric_samples(await r.text())["vllm:prefix_cache_hits_total"])

    for _ in range(2):
        async with http.post(sim.url + "/v1/completions", json=body) as r:
            assert r.status == 200
    assert await hits() == 144
    for path in ("/reset_prefix_cache", "/reset_mm_cache"):
        async with http.post(sim.url + path) as r:
            assert r.status == 200, path
    async with http.post(sim.url + "/v1/completions", json=body) as r:
        assert r.status == 200
    assert await hits() == 144  # nothing was left to hit


async def test_engine_death(make_sim: Any, http: aiohttp.ClientSession) -> None:
    sim = make_sim(env={"TUNER_SIM_DIE_AFTER_S": "0.5"})
    async with http.get(sim.url + "/health") as r:
        assert r.status == 200
    deadline = time.monotonic() + 5
    while "EngineCore encountered a fatal error." not in sim.log:
        assert time.monotonic() < deadline, sim.log
        await asyncio.sleep(0.05)
    async with http.get(sim.url + "/health") as r:
        assert r.status == 503
    body = {"model": "m", "prompt": "x", "max_tokens": 2}
    async with http.post(sim.url + "/v1/completions", json=body) as r:
        assert r.status >= 500
    sim.proc.wait(timeout=10)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(")")[-1].split()[0] != "Z"
    return True


def test_sigterm_stops_server_and_engine_core(make_sim: Any) -> None:
    sim = make_sim()
    child = sim.engine_pid()
    assert child != sim.proc.pid and _alive(child)
    t0 = time.monotonic()
    sim.proc.send_signal(signal.SIGTERM)
    sim.proc.wait(timeout=5)
    assert time.monotonic() - t0 < 1.5
    deadline = time.monotonic() + 1
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child)


def test_engine_core_survives_sigkill_of_server(make_sim: Any) -> None:
    sim = make_sim()
    child = sim.engine_pid()
    sim.proc.kill()
    sim.proc.wait(timeout=5)
    time.sleep(0.2)
    assert _alive(child)  # orphaned, like vLLM's EngineCore: only killpg cleans up
    os.killpg(sim.proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 2
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child)


def test_hang_never_ready(make_sim: Any) -> None:
    sim = make_sim(env={"TUNER_SIM_HANG": "1"}, ready=False)
    deadline = time.monotonic() + 15  # the interpreter's start alone can take a second here
    while "Model loading took" not in sim.log and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "Model loading took" in sim.log, sim.log
    time.sleep(1.0)  # at TUNER_SIM_SPEEDUP=200 a start-up that went on would have ended by now
    assert sim.proc.poll() is None
    assert "Application startup complete." not in sim.log
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", sim.port), timeout=1):
        pass
