"""The tuner's client (:func:`tuner.replay.replay` + :func:`tuner.score.summarize`) against
``vllm bench serve``: the same server, the same requests, the same concurrency; do they report the
same output tok/s, median TTFT and median TPOT? (Target: within ±3 %.)

Requests. ``--requests`` prompts of exactly ``--input-len`` tokens (windows of
``workloads/corpus.txt.gz`` cut token-exact with the model's tokenizer, fixed ``--seed``, all
different), request i asking for ``k_i`` tokens with ``ignore_eos`` on ``/v1/completions``,
``k_i`` uniform in ``--output-len`` x [1 - r, 1 + r] (``--output-range-ratio`` r, default 0.5;
with equal lengths every closed-loop slot finishes in the same engine step, the requests then
arrive in synchronised waves and the median TTFT of a run rests on a few waves). They are
written as a ShareGPT-format JSON file that ``vllm bench serve`` reads with ``--dataset-name
sharegpt --disable-shuffle --no-oversample``: that loader sends each prompt text as it is, in
file order, with no chat template, and asks for as many tokens as the reply has (the reply is
``" ok"`` x ``k_i``, checked to be ``k_i`` tokens; with r = 0, ``--sharegpt-output-len``); unlike
``custom`` it needs no pandas. The tuner's client gets the same texts as
:class:`~tuner.records.RequestSpec` bodies with the fields ``vllm bench serve`` puts in its
payload (``prompt``, ``max_tokens``, ``ignore_eos``, ``repetition_penalty`` 1.0, ``logprobs``
null, streaming with usage). Both run a closed loop: ``vllm bench serve --request-rate inf
--max-concurrency C`` and ``ArrivalConfig(kind="concurrency", concurrency=C)``; both first send
``--warmups`` copies of request 0 (``--num-warmups``; the tuner's client as warm-up specs), not
measured. Each pair is checked to have got the same per-request prompt and output token counts
from the server (``identical_token_counts``).

Open loop (``--rate R [R ...]``, after the closed loops of ``--concurrency``, which then defaults
to none): ``vllm bench serve --request-rate R --burstiness B --seed SEED`` and the tuner's client
with each spec's ``arrival_s`` set to the same times, which :func:`vllm_schedule` computes the way
vLLM 0.24 does (``--burstiness inf``, the default: constant gaps; 1: Poisson, from
``np.random`` seeded with ``--seed``). Both clients then send the same requests at the same
moments, so the server sees the same load whichever client drives it, and each run records how
late every request was sent against the schedule (``send_lag_*``, from the records' send times
and from vllm's ``start_times``): a check that the schedules match. ``R x --rate-duration-s``
requests per run unless ``--requests``. Below saturation the output tok/s is set by the schedule
(it tests the duration accounting: vllm's clock starts one gap before its first send, the
tuner's at its first send, 1 / R apart); the median TTFT is the comparison.

Server. By default a fresh simulator (``python -m tuner.sim serve MODEL_DIR ... --load-format
dummy``, ``TUNER_SIM_SPEEDUP`` = ``--sim-speedup``, 1 = real time) for every run, started and
stopped in its own process group by :class:`tuner.engine.process.Server`, so every run sees the
same idle server with an empty prefix cache. ``--server-cmd 'vllm serve ... --port {port}'``
launches that instead (``{port}``/``{host}`` are filled in); ``--one-server`` keeps one launched
server for all runs; ``--url`` measures a server that is already running (e.g. real ``vllm
serve`` on the H200). With one server for all runs, ``POST /reset_prefix_cache`` is tried before
every run (vLLM has it only with ``VLLM_SERVER_DEV_MODE=1``; otherwise start vLLM with
``--no-enable-prefix-caching``, the JSON records which), and each concurrency starts with one
unmeasured run of the tuner's client (``--no-server-warmup`` skips it): the first run on a fresh
server is slower, and the alternating order would give it to the tuner's client every time.

Order. For every concurrency, ``--reps`` pairs, interleaved and alternating (ours, vllm, vllm,
ours, ours, vllm, ...), so drift on a shared machine hits both clients. Per pair the ratio
ours / vllm of output tok/s, median TTFT and median TPOT; per concurrency the mean of those
ratios, and whether it is within ±``--tolerance`` for output tok/s and median TTFT. The server's
own ``vllm:time_to_first_token_seconds`` (mean, warm-ups included, from ``/metrics``) is recorded
beside each run: it tells server-side variation apart from what the clients measure. So are
the server's running and waiting requests (``vllm:num_requests_running`` / ``_waiting`` sampled
every 0.25 s by a child process, averaged over the middle 80 % of the span with requests running)
and, for the tuner's client, the time from a request's last token to the end of its stream and
from a free slot to the next send (p50/p90/p99/max): a closed loop that idles between requests
would show in both.

``vllm bench serve`` needs vLLM installed somewhere (CPU is enough: it is an HTTP client):
``--vllm PATH`` (default ``$TUNER_VLLM_CLI``, else ``vllm`` on ``PATH``); its tokenizer is
``--model-dir`` (offline: ``HF_HUB_OFFLINE=1`` is set for it).

Usage::

    python benchmarks/replay_vs_vllm_bench.py [--concurrency 8 64] [--rate R ...]
        [--burstiness B] [--reps 3] [--requests N] [--input-len 512] [--output-len 128]
        [--vllm PATH] [--url URL | --server-cmd CMD] [--one-server] [--quick] [--out PATH]
    python benchmarks/replay_vs_vllm_bench.py --combine A.json B.json ... [--out PATH]

``--combine`` measures nothing: it pools the complete pairs of earlier result files per load
(e.g. the same load on two GPUs) and prints the mean ratios with their standard errors.
On a machine where the server and the clients can share cores, pin them apart (``--server-cmd
'taskset -c 0-11 vllm serve ...'`` and the benchmark under ``taskset -c 12-15``): on the H200
host the unpinned comparison measured the server, not the clients
(``docs/replay-accuracy.md``).

``--quick``: one pair of 16 short requests at concurrency 4 (or at the first ``--rate``; about
a minute, mostly the ``vllm`` CLI importing torch). Writes
``benchmarks/results/replay_vs_vllm_bench.json`` (``replay_vs_vllm_bench-quick.json`` with
``--quick``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable as a plain script from anywhere
    sys.path.insert(0, str(ROOT))

from tuner.config import ArrivalConfig, SLOConfig  # noqa: E402
from tuner.engine.process import Server, free_port  # noqa: E402
from tuner.records import RequestRecord, RequestSpec  # noqa: E402
from tuner.replay import replay  # noqa: E402
from tuner.score import summarize  # noqa: E402
from tuner.telemetry.prom import MetricsScraper, parse_metrics  # noqa: E402
from tuner.workload.prompts import token_corpus  # noqa: E402

CLIENTS = ("ours", "vllm")
COMPARED = ("output_throughput", "ttft_p50_ms", "tpot_p50_ms")
"""The metrics the ratios are reported for; the target applies to the first two."""
TARGETED = ("output_throughput", "ttft_p50_ms")
REQUEST_TIMEOUT_S = 600.0
HOST = "127.0.0.1"


# --- requests ----------------------------------------------------------------------------------


def build_prompts(model_dir: Path, corpus: Path, n: int, input_len: int, seed: int) -> list[str]:
    """``n`` different prompt texts of exactly ``input_len`` tokens (as the model counts them)."""
    tc = token_corpus(model_dir, corpus)
    rng = np.random.default_rng(seed)
    prompts: list[str] = []
    seen: set[str] = set()
    while len(prompts) < n:
        text = tc.text(input_len, rng)
        if text not in seen and tc.count(text) == input_len:
            seen.add(text)
            prompts.append(text)
    return prompts


def output_lengths(n: int, output_len: int, range_ratio: float, seed: int) -> list[int]:
    """Output lengths uniform in ``output_len * [1 - r, 1 + r]`` (as ``vllm bench serve``'s
    ``--random-range-ratio``), at least 4 (the ShareGPT loader drops shorter ones)."""
    lo = max(4, round(output_len * (1 - range_ratio)))
    hi = max(lo, round(output_len * (1 + range_ratio)))
    rng = np.random.default_rng(seed + 1)
    return [int(x) for x in rng.integers(lo, hi + 1, size=n)]


COMPLETION_WORD = " ok"
"""The ShareGPT reply is this word ``k`` times: ``k`` tokens, so vllm asks for ``k`` tokens."""


def write_sharegpt(path: Path, prompts: Sequence[str], output_lens: Sequence[int]) -> None:
    """The requests as a ShareGPT file (``vllm bench serve --dataset-name sharegpt``): the prompt
    as the human turn, a reply of exactly ``output_lens[i]`` tokens as the gpt turn."""
    rows = [
        {
            "id": str(i),
            "conversations": [
                {"from": "human", "value": p},
                {"from": "gpt", "value": COMPLETION_WORD * k},
            ],
        }
        for i, (p, k) in enumerate(zip(prompts, output_lens, strict=True))
    ]
    path.write_text(json.dumps(rows))


def vllm_schedule(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """The send times (s after the benchmark's start) that ``vllm bench serve --request-rate
    RATE --burstiness B --seed SEED`` gives ``n`` requests (vLLM 0.24's ``get_request``):
    gaps gamma(shape B, scale 1 / (RATE B)) drawn from ``np.random`` seeded with SEED (B = 1:
    Poisson; B = inf: every gap 1 / RATE), summed, then scaled so the last send is at n / RATE.
    The first request goes after one gap, not at 0. Checked per run against the times vllm
    recorded (``send_lag_*``)."""
    if not rate > 0 or not burstiness > 0:
        raise ValueError(f"rate {rate} and burstiness {burstiness} must be > 0")
    if burstiness == float("inf"):
        gaps = np.full(n, 1.0 / rate)
    else:
        legacy = np.random.RandomState(seed)  # what np.random.seed(seed) gives np.random
        gaps = np.array([legacy.gamma(burstiness, 1.0 / (rate * burstiness)) for _ in range(n)])
    times = np.cumsum(gaps)
    if times[-1] != 0:
        times *= (n / rate) / times[-1]
    return [float(t) for t in times]


def send_lags(sent: Sequence[float], schedule: Sequence[float]) -> dict[str, float]:
    """How late each request was sent against the schedule, both relative to the first request
    (the clients' clocks start at different moments): p50/p99/max in ms, and the mean."""
    if not sent or len(sent) != len(schedule):
        return {}
    lags = [(t - sent[0]) - (s - schedule[0]) for t, s in zip(sent, schedule, strict=True)]
    return {
        **_ms_stats(lags, "send_lag"),
        "send_lag_mean_ms": round(1e3 * statistics.fmean(lags), 3),
    }


def burstiness_json(b: float) -> float | str:
    """JSON has no infinity: ``"inf"`` (constant gaps) as a string."""
    return "inf" if b == float("inf") else b


def load_label(concurrency: int | None, rate: float | None, burstiness: float | str | None) -> str:
    """``c64`` (closed loop), ``r24`` (open loop, constant gaps), ``r24-b1`` (gamma gaps)."""
    if rate is None:
        return f"c{concurrency}"
    b = float(burstiness if burstiness is not None else "inf")
    return f"r{rate:g}" + ("" if b == float("inf") else f"-b{b:g}")


class Load:
    """One load the clients are compared under: a closed loop of ``concurrency`` requests in
    flight, or an open loop at ``rate`` requests/s on vllm's schedule (:func:`vllm_schedule`)
    with gaps of ``burstiness``."""

    def __init__(
        self,
        concurrency: int | None = None,
        rate: float | None = None,
        burstiness: float = float("inf"),
    ) -> None:
        if (concurrency is None) == (rate is None):
            raise ValueError("a load is a concurrency or a rate")
        self.concurrency, self.rate, self.burstiness = concurrency, rate, burstiness

    @property
    def label(self) -> str:
        return load_label(self.concurrency, self.rate, self.burstiness)

    def __repr__(self) -> str:
        return self.label


def _body(prompt: str, output_len: int) -> dict[str, Any]:
    """What ``vllm bench serve`` (backend ``openai``) sends, less model and stream (which
    :func:`~tuner.replay.replay` adds)."""
    return {
        "prompt": prompt,
        "repetition_penalty": 1.0,
        "max_tokens": output_len,
        "logprobs": None,
        "ignore_eos": True,
    }


def build_specs(
    prompts: Sequence[str], input_len: int, output_lens: Sequence[int], warmups: int
) -> list[RequestSpec]:
    """Measured specs 0..n-1 and ``warmups`` warm-up copies of request 0 (as vllm's warm-up)."""
    n = len(prompts)
    specs = [
        RequestSpec(i, "completions", _body(p, k), input_len, k)
        for i, (p, k) in enumerate(zip(prompts, output_lens, strict=True))
    ]
    warm = _body(prompts[0], output_lens[0])
    specs += [
        RequestSpec(n + k, "completions", warm, input_len, output_lens[0], warmup=True)
        for k in range(warmups)
    ]
    return specs


# --- the two clients ---------------------------------------------------------------------------


async def run_ours(
    url: str,
    model: str,
    specs: Sequence[RequestSpec],
    concurrency: int | None,
    schedule: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The tuner's client: a closed loop of ``concurrency``, or (``schedule``) each measured
    spec sent at its time in the schedule, open loop."""
    if schedule is not None:
        measured_specs = [s for s in specs if not s.warmup]
        timed = iter(schedule)
        specs = [s if s.warmup else dataclasses.replace(s, arrival_s=next(timed)) for s in specs]
        assert len(measured_specs) == len(schedule)
        arrival = ArrivalConfig(kind="constant", rate=len(schedule) / schedule[-1])
    else:
        assert concurrency is not None
        arrival = ArrivalConfig(kind="concurrency", concurrency=concurrency)
    done_at: dict[int, float] = {}  # index -> when the client finished reading the stream
    starts: list[float] = []

    def on_record(r: RequestRecord) -> None:
        if not r.warmup:
            done_at[r.index] = time.perf_counter()

    records: list[RequestRecord] = await replay(
        url,
        model,
        specs,
        arrival,
        duration_s=1e9,
        request_timeout_s=REQUEST_TIMEOUT_S,
        on_record=on_record,
        on_start=starts.append,
    )
    m = summarize(records, SLOConfig())
    measured = [r for r in records if not r.warmup]
    errors = sorted({r.error or r.status for r in measured if r.status != "ok"})
    if schedule is not None:
        extra = send_lags([r.t_sent_s for r in measured], schedule)
    else:
        assert concurrency is not None
        extra = client_gaps(measured, done_at, starts[0] if starts else 0.0, concurrency)
    return {
        "completed": int(m["completed"]),
        "failed": int(m["failed"]),
        "duration_s": m["duration_s"],
        "output_throughput": m["output_throughput"],
        "ttft_p50_ms": m.get("ttft_p50_ms"),
        "ttft_mean_ms": m.get("ttft_mean_ms"),
        "tpot_p50_ms": m.get("tpot_p50_ms"),
        "itl_p50_ms": m.get("itl_p50_ms"),
        "e2e_p50_ms": m.get("e2e_p50_ms"),
        "input_lens": [r.prompt_tokens or 0 for r in measured],
        "output_lens": [(r.output_tokens or 0) if r.status == "ok" else 0 for r in measured],
        "errors": errors[:5],
        **extra,
    }


def _ms_stats(xs: Sequence[float], prefix: str) -> dict[str, float]:
    if not xs:
        return {}
    q = np.percentile(np.asarray(xs) * 1e3, [50, 90, 99, 100])
    return {
        f"{prefix}_{k}_ms": round(float(v), 3)
        for k, v in zip(("p50", "p90", "p99", "max"), q, strict=True)
    }


def client_gaps(
    measured: Sequence[RequestRecord], done_at: dict[int, float], t0: float, concurrency: int
) -> dict[str, float]:
    """Where a closed loop's slot can sit idle on the client's side.

    ``stream_end``: from a request's last token to the moment the client has read its stream to
    the end (the usage chunk, ``[DONE]``, the chunked body's end) and the slot is free;
    ``next_send``: from a slot freeing up to the next request's send (sorted ends against sorted
    sends, the first ``concurrency`` sends excluded).
    """
    ends = [
        done_at[r.index] - (t0 + r.t_sent_s + r.e2e_s)
        for r in measured
        if r.e2e_s is not None and r.index in done_at
    ]
    sends = sorted(t0 + r.t_sent_s for r in measured)[concurrency:]
    frees = sorted(done_at.values())[: len(sends)]
    nexts = [s - f for s, f in zip(sends, frees, strict=False)]
    return {**_ms_stats(ends, "stream_end"), **_ms_stats(nexts, "next_send")}


# --- the server's running / waiting requests during a run, from a separate process --------------

SCRAPED = ("vllm:num_requests_running", "vllm:num_requests_waiting")


async def _scrape_main(url: str, out: Path, interval_s: float) -> None:
    """``--scrape URL OUT INTERVAL``: poll /metrics until SIGTERM, then write the samples."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with MetricsScraper(url, interval_s, SCRAPED) as s:
        await stop.wait()
    text = json.dumps({"samples": s.samples, "errors": s.errors})
    await asyncio.to_thread(out.write_text, text)


@contextlib.asynccontextmanager
async def server_queue(
    url: str, path: Path, concurrency: int | None
) -> AsyncIterator[dict[str, Any]]:
    """Samples ``vllm:num_requests_running`` / ``_waiting`` every 0.25 s in a child process (so
    neither client shares its event loop or its core with the scraper); on exit the yielded dict
    gets, over the middle 80 % of the span with requests running: mean running, the share of
    samples with all ``concurrency`` requests running (closed loop only), mean waiting."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--scrape", url, str(path), "0.25"
    )
    stats: dict[str, Any] = {}
    try:
        await asyncio.sleep(1.5)  # the child imports and takes its first sample
        yield stats
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        await proc.wait()
        try:
            samples = json.loads(await asyncio.to_thread(path.read_text))["samples"]
        except (OSError, ValueError, KeyError):
            samples = []
        if samples:
            # the run is the span with requests running (vllm's CLI first imports for seconds)
            busy = [x["t_s"] for x in samples if x.get(SCRAPED[0], 0.0) > 0]
            a, b = (busy[0], busy[-1]) if busy else (0.0, 0.0)
            mid = [x for x in samples if a + 0.1 * (b - a) <= x["t_s"] <= b - 0.1 * (b - a)]
            run = [x.get(SCRAPED[0], 0.0) for x in mid]
            wait = [x.get(SCRAPED[1], 0.0) for x in mid]
            if run:
                stats["server_running_mean"] = round(statistics.fmean(run), 2)
                if concurrency is not None:
                    stats["server_running_full_share"] = round(
                        sum(v >= concurrency for v in run) / len(run), 3
                    )
                stats["server_waiting_mean"] = round(statistics.fmean(wait), 2)
                stats["server_queue_samples"] = len(run)


def vllm_argv(
    cli: str,
    url: str,
    model: str,
    model_dir: Path,
    dataset: Path,
    n: int,
    output_len: int | None,
    load: Load,
    warmups: int,
    result: Path,
    seed: int = 0,
) -> list[str]:
    """The ``vllm bench serve`` command line; ``output_len`` None: each reply's token count."""
    fixed = [] if output_len is None else ["--sharegpt-output-len", str(output_len)]
    if load.rate is None:
        pace = ["--request-rate", "inf", "--max-concurrency", str(load.concurrency)]
    else:
        pace = ["--request-rate", repr(load.rate), "--burstiness", repr(load.burstiness)]
    return [
        cli, "bench", "serve",
        "--backend", "openai",
        "--base-url", url,
        "--endpoint", "/v1/completions",
        "--model", str(model_dir),
        "--served-model-name", model,
        "--dataset-name", "sharegpt",
        "--dataset-path", str(dataset),
        "--disable-shuffle",
        "--no-oversample",
        *fixed,
        "--num-prompts", str(n),
        *pace,
        "--seed", str(seed),
        "--num-warmups", str(warmups),
        "--ignore-eos",
        "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99",
        "--save-result",
        "--save-detailed",
        "--result-dir", str(result.parent),
        "--result-filename", result.name,
    ]  # fmt: skip


async def run_vllm(
    argv: Sequence[str], result: Path, log_path: Path, schedule: Sequence[float] | None = None
) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("OPENAI_API_KEY", None)  # it would become an Authorization header
    with _fresh_log(result, log_path) as logf:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env
        )
        rc = await proc.wait()
    res = parse_vllm_result(rc, result, log_path)
    starts = res.pop("start_times")
    if schedule is not None:
        res.update(send_lags(starts, schedule))
    return res


def _fresh_log(result: Path, log_path: Path) -> BinaryIO:
    result.unlink(missing_ok=True)
    return log_path.open("wb")


def parse_vllm_result(rc: int, result: Path, log_path: Path) -> dict[str, Any]:
    """``vllm bench serve``'s saved JSON (``--save-result --save-detailed``) in our keys."""
    if rc != 0 or not result.is_file():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"vllm bench serve failed (exit {rc}):\n{tail}")
    d = json.loads(result.read_text())
    errors = [e for e in d.get("errors", []) if e]
    return {
        "completed": int(d["completed"]),
        "failed": int(d["failed"]),
        "duration_s": d["duration"],
        "output_throughput": d["output_throughput"],
        "ttft_p50_ms": d["median_ttft_ms"],
        "ttft_mean_ms": d["mean_ttft_ms"],
        "tpot_p50_ms": d["median_tpot_ms"],
        "itl_p50_ms": d["median_itl_ms"],
        "e2e_p50_ms": d["median_e2el_ms"],
        "input_lens": list(d.get("input_lens", [])),
        "output_lens": list(d.get("output_lens", [])),
        "start_times": list(d.get("start_times", [])),
        "errors": [str(e)[:300] for e in errors[:5]],
    }


def vllm_version(cli: str) -> str | None:
    """vLLM's version from the CLI's interpreter (without importing vllm: that takes seconds)."""
    try:
        first = Path(cli).read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    if not first.startswith("#!"):
        return None
    code = "from importlib.metadata import version; print(version('vllm'))"
    try:
        out = subprocess.run(
            [*shlex.split(first[2:].strip()), "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


# --- the server --------------------------------------------------------------------------------


class Target:
    """Where the requests go: a server launched per run, one launched once, or a given URL."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.shared: Server | None = None
        self.launches = 0
        self.prefix_reset: list[bool] = []

    def _argv(self, port: int) -> list[str]:
        a = self.args
        if a.server_cmd:
            return shlex.split(a.server_cmd.format(port=port, host=HOST))
        return [
            sys.executable, "-m", "tuner.sim", "serve", str(a.model_dir),
            "--host", HOST, "--port", str(port),
            "--served-model-name", a.served_model_name,
            "--load-format", "dummy",
            *a.server_arg,
        ]  # fmt: skip

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        if not self.args.server_cmd:
            env["TUNER_SIM_SPEEDUP"] = str(self.args.sim_speedup)
        return env

    async def _launch(self) -> Server:
        port = free_port(HOST)
        self.launches += 1
        server = Server(
            self._argv(port),
            env=self._env(),
            log_path=self.workdir / f"server-{self.launches}.log",
            host=HOST,
            port=port,
            startup_timeout_s=self.args.startup_timeout_s,
        )
        try:
            await server.start()
        except BaseException:
            await server.stop()
            raise
        return server

    @contextlib.asynccontextmanager
    async def server(self) -> AsyncIterator[str]:
        """The base URL of a server ready for one run (fresh, or the shared one reset)."""
        if self.args.url:
            await self._reset(self.args.url.rstrip("/"))
            yield self.args.url.rstrip("/")
            return
        if self.args.one_server:
            if self.shared is None:
                self.shared = await self._launch()
            await self._reset(self.shared.base_url)
            yield self.shared.base_url
            return
        server = await self._launch()
        try:
            yield server.base_url
        finally:
            await server.stop()

    async def _reset(self, url: str) -> None:
        ok = False
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            timeout = aiohttp.ClientTimeout(total=30)
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.post(url + "/reset_prefix_cache") as r,
            ):
                ok = r.status == 200
        self.prefix_reset.append(ok)

    async def close(self) -> None:
        if self.shared is not None:
            await self.shared.stop()
            self.shared = None


async def server_metrics(url: str) -> dict[str, float]:
    """Counters from the server's ``/metrics``: TTFT histogram sum/count, generated tokens."""
    try:
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url + "/metrics") as r:
            text = await r.text()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return {}
    v = parse_metrics(text)
    return {
        "ttft_sum_s": v.get("vllm:time_to_first_token_seconds_sum", 0.0),
        "ttft_count": v.get("vllm:time_to_first_token_seconds_count", 0.0),
        "generation_tokens": v.get(
            "vllm:generation_tokens_total", v.get("vllm:generation_tokens", 0.0)
        ),
    }


# --- the measurement ---------------------------------------------------------------------------


def check_replies(model_dir: Path, corpus: Path, output_lens: Sequence[int]) -> None:
    """Each ShareGPT reply is as many tokens as the request asks for (vllm counts the reply)."""
    tc = token_corpus(model_dir, corpus)
    for k in sorted(set(output_lens)):
        got = tc.count(COMPLETION_WORD * k)
        if got != k:
            raise SystemExit(f"a reply of {k} x {COMPLETION_WORD!r} is {got} tokens, not {k}")


def _order(rep: int) -> tuple[str, str]:
    """ABBA: ours first in even pairs, vllm first in odd ones."""
    return CLIENTS if rep % 2 == 0 else (CLIENTS[1], CLIENTS[0])


async def measure(
    args: argparse.Namespace, workdir: Path, runs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Appends each finished run to ``runs`` (so an interrupted benchmark keeps them)."""
    prompts_by_n: dict[int, list[str]] = {}
    target = Target(args, workdir)
    try:
        for load in args.loads:
            conc, tag = load.concurrency, load.label
            if load.rate is None:
                assert conc is not None
                n = args.requests or max(args.min_requests, args.waves * conc)
                schedule = None
            else:
                n = args.requests or max(args.min_requests, round(load.rate * args.rate_duration_s))
                schedule = vllm_schedule(n, load.rate, load.burstiness, args.seed)
            if n not in prompts_by_n:
                prompts_by_n[n] = build_prompts(
                    args.model_dir, args.corpus, n, args.input_len, args.seed
                )
            prompts = prompts_by_n[n]
            lens = output_lengths(n, args.output_len, args.output_range_ratio, args.seed)
            dataset = workdir / f"prompts-{n}.json"
            write_sharegpt(dataset, prompts, lens)
            check_replies(args.model_dir, args.corpus, lens)
            specs = build_specs(prompts, args.input_len, lens, args.warmups)
            if (args.one_server or args.url) and args.server_warmup:
                # the first run on a fresh server is slower (first batches of each shape, lazy
                # allocations: 0.81x the later runs' tok/s on the simulator), and the ABBA order
                # gives that run to the tuner's client: warm the server first, unmeasured
                async with target.server() as url:
                    await run_ours(url, args.served_model_name, specs, conc, schedule)
                print(f"{tag} server warm-up run done (not measured)", flush=True)
            for rep in range(args.reps):
                for pos, client in enumerate(_order(rep)):
                    async with (
                        target.server() as url,
                        server_queue(
                            url, workdir / f"queue-{tag}-r{rep}-{client}.json", conc
                        ) as queue,
                    ):
                        before = await server_metrics(url)
                        t0 = time.time()
                        if client == "ours":
                            res = await run_ours(url, args.served_model_name, specs, conc, schedule)
                        else:
                            result = workdir / f"vllm-{tag}-r{rep}.json"
                            argv = vllm_argv(
                                args.vllm,
                                url,
                                args.served_model_name,
                                args.model_dir,
                                dataset,
                                n,
                                args.output_len if args.output_range_ratio == 0 else None,
                                load,
                                args.warmups,
                                result,
                                args.seed,
                            )
                            log_path = workdir / f"vllm-{tag}-r{rep}.log"
                            res = await run_vllm(argv, result, log_path, schedule)
                        after = await server_metrics(url)
                    row = {
                        "load": tag,
                        "concurrency": conc,
                        "rate": load.rate,
                        "burstiness": None
                        if load.rate is None
                        else burstiness_json(load.burstiness),
                        "requests": n,
                        "rep": rep,
                        "position": pos,
                        "client": client,
                        "started_at": round(t0, 3),
                        **res,
                        **queue,
                    }
                    if before and after and after["ttft_count"] > before["ttft_count"]:
                        dn = after["ttft_count"] - before["ttft_count"]
                        row["server_ttft_mean_ms"] = (
                            1e3 * (after["ttft_sum_s"] - before["ttft_sum_s"]) / dn
                        )
                        row["server_generation_tokens"] = (
                            after["generation_tokens"] - before["generation_tokens"]
                        )
                        if row.get("ttft_mean_ms") is not None:
                            row["client_ttft_overhead_ms"] = (
                                row["ttft_mean_ms"] - row["server_ttft_mean_ms"]
                            )
                    runs.append(row)
                    print(_line(row), flush=True)
    finally:
        args.prefix_cache_reset = target.prefix_reset
        await target.close()
    return runs


def _fmt(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def _load_of(r: dict[str, Any]) -> str:
    """A run's load label, from its fields (rows written before open-loop loads have only
    ``concurrency``)."""
    return load_label(r.get("concurrency"), r.get("rate"), r.get("burstiness"))


def _line(r: dict[str, Any]) -> str:
    full = (
        f" (all {r['concurrency']}: {_fmt(r.get('server_running_full_share'), 2)})"
        if r.get("concurrency") is not None
        else ""
    )
    return (
        f"{_load_of(r):>5s} rep {r['rep']} {r['client']:4s}: "
        f"{r['completed']}/{r['completed'] + r['failed']} ok, "
        f"{_fmt(r['output_throughput'])} tok/s, TTFT p50 {_fmt(r['ttft_p50_ms'])} ms, "
        f"TPOT p50 {_fmt(r['tpot_p50_ms'], 2)} ms, "
        f"server TTFT mean {_fmt(r.get('server_ttft_mean_ms'))} ms, "
        f"running {_fmt(r.get('server_running_mean'))}{full}, "
        f"waiting {_fmt(r.get('server_waiting_mean'))}"
        + (
            f", stream end p50/p99 {_fmt(r['stream_end_p50_ms'], 2)}/"
            f"{_fmt(r['stream_end_p99_ms'], 2)} ms, next send p50/p99 "
            f"{_fmt(r.get('next_send_p50_ms'), 2)}/{_fmt(r.get('next_send_p99_ms'), 2)} ms"
            if "stream_end_p50_ms" in r
            else ""
        )
        + (
            f", sent late p50/p99/max {_fmt(r['send_lag_p50_ms'], 2)}/"
            f"{_fmt(r['send_lag_p99_ms'], 2)}/{_fmt(r['send_lag_max_ms'], 2)} ms"
            if "send_lag_p50_ms" in r
            else ""
        )
    )


def _same_tokens(o: dict[str, Any], v: dict[str, Any]) -> bool:
    """Did the server count the same tokens per request for both runs of a pair? (Pooled runs
    from saved files no longer hold the counts; they carry their file's verdict.)"""
    if "input_lens" in o and "input_lens" in v:
        return bool(o["input_lens"] == v["input_lens"] and o["output_lens"] == v["output_lens"])
    return bool(o.get("identical_token_counts")) and bool(v.get("identical_token_counts"))


def summarise(runs: Sequence[dict[str, Any]], tolerance: float) -> list[dict[str, Any]]:
    """Per load: per-pair ratios ours/vllm, their mean and standard error, and the verdict."""
    out = []
    loads = list(dict.fromkeys(_load_of(r) for r in runs))
    for load in loads:
        mine = [r for r in runs if _load_of(r) == load]
        reps = sorted({r["rep"] for r in mine})
        pairs = []
        for rep in reps:
            by = {r["client"]: r for r in mine if r["rep"] == rep}
            if set(by) == set(CLIENTS):
                pairs.append((by["ours"], by["vllm"]))
        ratios: dict[str, Any] = {}
        for key in COMPARED:
            values = [o[key] / v[key] for o, v in pairs if o.get(key) and v.get(key)]  # per pair
            ours = [o[key] for o, _ in pairs if o.get(key)]
            theirs = [v[key] for _, v in pairs if v.get(key)]
            ratios[key] = {
                "per_pair": values,
                "mean": statistics.fmean(values) if values else None,
                "sem": statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None,
                "min": min(values, default=None),
                "max": max(values, default=None),
                "ours_mean": statistics.fmean(ours) if ours else None,
                "vllm_mean": statistics.fmean(theirs) if theirs else None,
            }
        same = all(_same_tokens(o, v) for o, v in pairs)
        within = {
            k: ratios[k]["mean"] is not None and abs(ratios[k]["mean"] - 1.0) <= tolerance
            for k in TARGETED
        }
        all_ok = all(r["failed"] == 0 for o_v in pairs for r in o_v)
        overhead: dict[str, float | None] = {}
        for i, client in enumerate(CLIENTS):  # client TTFT mean - the server's, per client
            xs = [
                p[i]["client_ttft_overhead_ms"] for p in pairs if "client_ttft_overhead_ms" in p[i]
            ]
            overhead[client] = statistics.fmean(xs) if xs else None
        running: dict[str, float | None] = {}
        for i, client in enumerate(CLIENTS):  # the server's mean running requests, per client
            xs = [p[i]["server_running_mean"] for p in pairs if "server_running_mean" in p[i]]
            running[client] = statistics.fmean(xs) if xs else None
        lags: dict[str, float | None] = {}
        for i, client in enumerate(CLIENTS):  # the worst send lag over the runs, per client
            xs = [p[i]["send_lag_max_ms"] for p in pairs if "send_lag_max_ms" in p[i]]
            lags[client] = max(xs) if xs else None
        first = mine[0]
        out.append(
            {
                "load": load,
                "concurrency": first.get("concurrency"),
                "rate": first.get("rate"),
                "burstiness": first.get("burstiness"),
                "pairs": len(pairs),
                "ratios": ratios,
                "identical_token_counts": same,
                "client_ttft_overhead_ms": overhead,
                "server_running_mean": running,
                "send_lag_max_ms": lags,
                "all_requests_ok": all_ok,
                "within_tolerance": within,
                "holds": all(within.values()) and same and all_ok,
            }
        )
    return out


def _complete_pairs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs whose pair (same concurrency and rep, both clients) finished."""
    have: dict[tuple[str, int], set[str]] = {}
    for r in runs:
        have.setdefault((_load_of(r), r["rep"]), set()).add(r["client"])
    return [r for r in runs if have[(_load_of(r), r["rep"])] == {"ours", "vllm"}]


def table(runs: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| load | run | client | output tok/s | TTFT p50 ms | TPOT p50 ms | TTFT mean ms "
        "| server TTFT mean ms | ratio tok/s | ratio TTFT p50 | ratio TPOT p50 |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        ratio = ["", "", ""]
        if r["client"] == "ours":
            other = next(
                (
                    x
                    for x in runs
                    if x["client"] == "vllm" and _load_of(x) == _load_of(r) and x["rep"] == r["rep"]
                ),
                None,
            )
            if other is not None:
                ratio = [
                    f"{r[k] / other[k]:.3f}" if r.get(k) and other.get(k) else "—" for k in COMPARED
                ]
        who = "tuner" if r["client"] == "ours" else "vllm"
        lines.append(
            f"| {_load_of(r)} | {r['rep'] + 1} | {who}"
            f" | {_fmt(r['output_throughput'])} | {_fmt(r['ttft_p50_ms'])} "
            f"| {_fmt(r['tpot_p50_ms'], 2)} | {_fmt(r.get('ttft_mean_ms'))} "
            f"| {_fmt(r.get('server_ttft_mean_ms'))} | " + " | ".join(ratio) + " |"
        )
    for s in summary:
        mean = [s["ratios"][k]["mean"] for k in COMPARED]
        lines.append(
            f"| {s['load']} | mean | tuner/vllm | | | | | | "
            + " | ".join("—" if m is None else f"**{m:.3f}**" for m in mean)
            + " |"
        )
    return "\n".join(lines)


def combine(paths: Sequence[Path], tolerance: float) -> dict[str, Any]:
    """The complete pairs of several result files pooled per load (a pair stays within its
    file: reps are renumbered file after file), summarised as one run would be."""
    runs: list[dict[str, Any]] = []
    for path in paths:
        data = json.loads(path.read_text())
        offset = 1 + max((r["rep"] for r in runs), default=-1)
        same = {_load_of(s): s["identical_token_counts"] for s in data["summary"]}
        for r in _complete_pairs(list(data["runs"])):
            verdict = bool(same.get(_load_of(r), False))
            runs.append(
                {
                    **r,
                    "rep": r["rep"] + offset,
                    "file": path.name,
                    "identical_token_counts": verdict,
                }
            )
    summary = summarise(runs, tolerance)
    return {
        "setup": {"combined": [str(p) for p in paths], "tolerance": tolerance},
        "runs": runs,
        "summary": summary,
        "holds": bool(summary) and all(s["holds"] for s in summary),
    }


def print_verdicts(summary: Sequence[dict[str, Any]], tolerance: float) -> None:
    def ratio(s: dict[str, Any], key: str) -> str:
        m, e = s["ratios"][key]["mean"], s["ratios"][key].get("sem")
        return "—" if m is None else f"{m:.4f}" + ("" if e is None else f" ± {e:.4f}")

    for s in summary:
        verdict = "holds" if s["holds"] else "does NOT hold"
        print(
            f"{s['load']}: {s['pairs']} pairs, mean ratio tuner/vllm (± standard error) output "
            f"tok/s {ratio(s, 'output_throughput')}, TTFT p50 {ratio(s, 'ttft_p50_ms')}, TPOT p50 "
            f"{ratio(s, 'tpot_p50_ms')}; identical token counts {s['identical_token_counts']}; "
            f"±{tolerance:.0%} {verdict}"
        )


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--scrape":
        asyncio.run(_scrape_main(sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])))
        return
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        help="closed loops to compare under (default: 8 64 unless --rate is given)",
    )
    ap.add_argument(
        "--rate",
        type=float,
        nargs="+",
        default=[],
        help="open loops at these requests/s, on vllm's own schedule (after the closed loops)",
    )
    ap.add_argument(
        "--burstiness",
        type=float,
        default=float("inf"),
        help="--rate's gaps: gamma shape (1: Poisson); inf (default): constant gaps",
    )
    ap.add_argument(
        "--rate-duration-s",
        type=float,
        default=30.0,
        help="with --rate and --requests 0: rate x this many requests per run",
    )
    ap.add_argument("--reps", type=int, default=3, help="pairs (ours + vllm) per concurrency")
    ap.add_argument(
        "--requests", type=int, default=0, help="measured requests per run (0: waves x conc)"
    )
    ap.add_argument("--waves", type=int, default=16, help="requests per slot when --requests 0")
    ap.add_argument("--min-requests", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=512, help="prompt tokens (ShareGPT: <= 1024)")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument(
        "--output-range-ratio",
        type=float,
        default=0.5,
        help="output lengths uniform in output-len x [1-r, 1+r] (0: all output-len)",
    )
    ap.add_argument("--warmups", type=int, default=1, help="warm-up copies of request 0 per run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-dir", type=Path, default=ROOT / "models/qwen3-8b-dummy")
    ap.add_argument("--corpus", type=Path, default=ROOT / "workloads/corpus.txt.gz")
    ap.add_argument("--served-model-name", default="m")
    ap.add_argument(
        "--vllm",
        default=os.environ.get("TUNER_VLLM_CLI") or shutil.which("vllm"),
        help="the vllm CLI (default: $TUNER_VLLM_CLI, else vllm on PATH)",
    )
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--url", help="measure this running server (no launches)")
    where.add_argument(
        "--server-cmd", help="launch this instead of the simulator; {port} and {host} filled in"
    )
    ap.add_argument("--one-server", action="store_true", help="launch once for all runs")
    ap.add_argument(
        "--no-server-warmup",
        dest="server_warmup",
        action="store_false",
        help="with --one-server/--url: skip the unmeasured warm-up run per concurrency",
    )
    ap.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra simulator flag (repeatable, e.g. --server-arg=--max-num-seqs=64)",
    )
    ap.add_argument("--sim-speedup", type=float, default=1.0, help="TUNER_SIM_SPEEDUP")
    ap.add_argument("--startup-timeout-s", type=float, default=900.0)
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--workdir", type=Path, help="keep prompts, logs and vllm's JSON here")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="one pair of 16 short requests, at concurrency 4 (or the first --rate)",
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--combine",
        type=Path,
        nargs="+",
        help="measure nothing: pool the pairs of these result files per load (--out: where to)",
    )
    args = ap.parse_args()
    if args.combine:
        pooled = combine(args.combine, args.tolerance)
        print(table(pooled["runs"], pooled["summary"]))
        print()
        print_verdicts(pooled["summary"], args.tolerance)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(pooled, indent=1) + "\n")
            print(f"wrote {args.out}")
        return
    if not args.vllm:
        raise SystemExit("no vllm CLI: pass --vllm PATH or set TUNER_VLLM_CLI")
    args.model_dir = args.model_dir.resolve()
    if args.quick:
        args.reps, args.requests = 1, 16
        args.concurrency = [] if args.rate else [4]
        args.rate = args.rate[:1]
        args.input_len, args.output_len = min(args.input_len, 64), min(args.output_len, 16)
    hi = round(args.output_len * (1 + args.output_range_ratio))
    if not 4 <= args.input_len <= 1024 or args.input_len + hi > 2048:
        raise SystemExit("vllm's ShareGPT loader takes 4..1024 prompt and <= 2048 total tokens")
    if args.concurrency is None:
        args.concurrency = [] if args.rate else [8, 64]
    bad = [x for x in [*args.concurrency, *args.rate] if not x > 0]
    if bad or not args.burstiness > 0:
        raise SystemExit(
            f"--concurrency, --rate and --burstiness must be > 0 (got {bad or args.burstiness})"
        )
    args.loads = [Load(concurrency=c) for c in args.concurrency] + [
        Load(rate=r, burstiness=args.burstiness) for r in args.rate
    ]
    if args.out is None:
        name = "replay_vs_vllm_bench-quick.json" if args.quick else "replay_vs_vllm_bench.json"
        args.out = ROOT / "benchmarks/results" / name

    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.workdir is not None:
            workdir = args.workdir.resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rvb-")))
        runs: list[dict[str, Any]] = []
        interrupted = False
        try:
            asyncio.run(measure(args, workdir, runs))
        except KeyboardInterrupt:  # keep the pairs that finished (e.g. a time limit's SIGINT)
            interrupted = True
            print(f"interrupted after {len(runs)} runs; the summary counts complete pairs only")
    if not hasattr(args, "prefix_cache_reset"):
        args.prefix_cache_reset = None
    runs = _complete_pairs(runs)
    summary = summarise(runs, args.tolerance)
    server = (
        f"url {args.url}"
        if args.url
        else (args.server_cmd or f"tuner.sim ({args.model_dir.name}, speedup {args.sim_speedup:g})")
    )
    fresh = not (args.url or args.one_server)
    result = {
        "setup": {
            "server": server,
            "fresh_server_per_run": fresh,
            "prefix_cache_reset_before_run": None if fresh else args.prefix_cache_reset,
            "server_warmup_run": not fresh and args.server_warmup,
            "server_args": args.server_arg,
            "endpoint": "/v1/completions",
            "concurrency": args.concurrency,
            "rate": args.rate,
            "burstiness": burstiness_json(args.burstiness) if args.rate else None,
            "rate_duration_s": args.rate_duration_s if args.rate else None,
            "reps": args.reps,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "output_range_ratio": args.output_range_ratio,
            "warmups": args.warmups,
            "seed": args.seed,
            "model_dir": str(args.model_dir),
            "vllm_cli": args.vllm,
            "vllm_version": vllm_version(args.vllm),
            "order": "per load, pairs alternate (ours, vllm), (vllm, ours), ...",
            "tolerance": args.tolerance,
            "quick": args.quick,
            "interrupted": interrupted,
            "cpus": os.cpu_count(),
            "load_avg_at_end": list(os.getloadavg()),
            "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(),
            "wall_s": round(time.perf_counter() - started, 1),
        },
        "runs": [
            {k: v for k, v in r.items() if k not in ("input_lens", "output_lens")} for r in runs
        ],
        "summary": summary,
        "holds": bool(summary) and all(s["holds"] for s in summary),
    }
    print()
    print(table(runs, summary))
    print()
    print_verdicts(summary, args.tolerance)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
