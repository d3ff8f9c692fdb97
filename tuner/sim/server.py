"""The simulated ``vllm serve`` process: start-up sequence, EngineCore child, OpenAI HTTP API.

Modelled: vLLM's start-up log lines and their order, the refusals (exit 1), an ``EngineCore``
child process that is not a daemon and survives a SIGKILL of this process (so a launcher must
kill the process group), a port that only accepts connections once the engine is ready, clean
SIGTERM/SIGINT shutdown, engine death (``TUNER_SIM_DIE_AFTER_S``), and the endpoints
``/health``, ``/v1/models``, ``/version``, ``/metrics``, ``/v1/completions`` and
``/v1/chat/completions`` (streaming and not). A streamed token's *text* is a filler word: only
counts and timing are meaningful. A response that is not streamed is the simulated model's greedy
output (:mod:`tuner.sim.answers`: deterministic per prompt, changed by flags that change numerics,
with ``logprobs`` and ``top_logprobs`` on the chat endpoint), so that the eval replay of the
confirm stage's quality guard runs here; with ``--speculative-config``, vLLM's ``spec_decode``
counters (its speed is not modelled). Not modelled: ``n>1``, streamed logprobs, logprobs of
``/v1/completions``, echo, stop strings, tools, audio/video.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tuner.memory import format_gib
from tuner.sim import answers
from tuner.sim.cli import SimArgs
from tuner.sim.logs import SimLog
from tuner.sim.runtime import AsyncEngine, EngineDeadError
from tuner.sim.startup import (
    Refusal,
    Settings,
    compile_hashes,
    compiles,
    engine_check,
    env_float,
    resolve,
)
from tuner.workload.images import image_tokens, model_image_grid

__all__ = ["VERSION", "serve"]

VERSION = "0.24.0"
WORDS = [" the", " model", " is", " fast", " and", " simulated", " tokens", " flow"]
ENGINE_CHILD = (
    "import signal, time\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "while True:\n"
    "    time.sleep(3600)\n"
)
DEATH_EXIT_S = 3.0


class ApiError(Exception):
    def __init__(self, status: int, message: str, typ: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.typ = typ

    def response(self) -> web.Response:
        body = {
            "error": {"message": self.message, "type": self.typ, "param": None, "code": self.status}
        }
        return web.json_response(body, status=self.status)


def serve(args: SimArgs, env: Mapping[str, str]) -> int:
    """Run the simulated server until SIGTERM/SIGINT or engine death; the process exit code."""
    log = SimLog()
    log.api(f"vLLM API server version {VERSION}", "api_server.py:1943")
    log.api(f"non-default args: {args.non_default_args()}", "utils.py:253")
    try:
        settings = resolve(args, env)
    except Refusal as exc:
        log.api_traceback(exc.frames, exc.exc_line)
        return 1
    try:
        return asyncio.run(_run(args, settings, env, log))
    except KeyboardInterrupt:
        return 0


class _Server:
    def __init__(self, args: SimArgs, s: Settings, env: Mapping[str, str], log: SimLog) -> None:
        self.args = args
        self.s = s
        self.env = env
        self.log = log
        self.stop = asyncio.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.engine: AsyncEngine | None = None
        self.exit_code = 0
        self.requests_seen = 0  # generate requests, for TUNER_SIM_STALL
        self.stalls = {  # TUNER_SIM_STALL=N:S[,N:S...]: the N-th request -> S seconds
            int(n): float(seconds or 1.0)
            for n, _, seconds in (
                stall.partition(":") for stall in env.get("TUNER_SIM_STALL", "").split(",") if stall
            )
        }
        self._tokenizer: Any = None
        self._segments: Any = None
        self._template: Any = None
        self.image_grid = model_image_grid(s.model_dir)
        self.spec: answers.SpecDecodeMetrics | None = None
        # the flags that change numerics change the greedy outputs (tuner.sim.answers)
        self.numerics = {
            "kv_cache_dtype": args.kv_cache_dtype,
            "quantization": args.quantization,
            "dtype": args.dtype,
            "speculative_config": args.speculative_config,
        }

    # ---------------------------------------------------------------- start-up

    def spawn_engine_core(self) -> None:
        self.child = subprocess.Popen(
            [sys.executable, "-S", "-c", ENGINE_CHILD],
            stdin=subprocess.DEVNULL,
            close_fds=True,
        )
        self.log.engine_pid = self.child.pid

    def stop_engine_core(self) -> None:
        child = self.child
        if child is None or child.poll() is not None:
            return
        child.terminate()
        try:
            child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=2)

    async def pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` (wall); True if a stop signal arrived meanwhile."""
        if seconds <= 0:
            return self.stop.is_set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)
        return self.stop.is_set()

    async def start_engine(self) -> bool:
        """Log the EngineCore start-up; False on a refusal (already logged) or a stop signal."""
        s, r, mem, log = self.s, self.s.resolved, self.s.memory, self.log
        self.spawn_engine_core()
        log.engine(
            f"Initializing a V1 LLM engine (v{VERSION}) with config: "
            f"model='{self.args.model_tag}', "
            f"tokenizer='{self.args.model_tag}', dtype=torch.bfloat16, "
            f"max_seq_len={s.max_model_len}, tensor_parallel_size={r.tensor_parallel_size}, "
            f"kv_cache_dtype={r.kv_cache_dtype}, load_format={self.args.load_format}, "
            f"enable_prefix_caching={r.enable_prefix_caching}, "
            f"enable_chunked_prefill={r.enable_chunked_prefill}, "
            f"compilation_config={{'cudagraph_mode': {r.cudagraph_mode}, "
            f"'max_cudagraph_capture_size': {max(r.capture_sizes, default=0)}}}",
            "core.py:99",
        )
        try:
            engine_check(s, self.env, "init")
            load_s = 1.0 + 0.35 * mem.weights_gib
            log.engine(
                f"Model loading took {format_gib(mem.weights_gib * (1 << 30))} GiB memory and "
                f"{load_s:.6f} seconds",
                "gpu_model_runner.py:5259",
            )
            if self.env.get("TUNER_SIM_HANG") == "1":
                await self.stop.wait()
                return False
            engine_check(s, self.env, "backend")
            compile_s = self.compile() if compiles(s, self.args) else 0.0
            graphs = r.cudagraph_mode != "NONE"
            if graphs:
                log.engine(
                    f"Estimated CUDA graph memory: {mem.cudagraph_gib:.2f} GiB total",
                    "gpu_model_runner.py:6591",
                )
            log.engine(
                f"Available KV cache memory: {format_gib(mem.kv_gib * (1 << 30))} GiB",
                "gpu_worker.py:511",
            )
            engine_check(s, self.env, "kv")
        except Refusal as exc:
            log.engine_traceback(exc.frames, exc.exc_line)
            self.stop_engine_core()
            log.api_traceback(
                [
                    '  File "/usr/local/lib/python3.12/site-packages/vllm/v1/engine/utils.py", '
                    "line 1276, in wait_for_engine_startup",
                ],
                "RuntimeError: Engine core initialization failed. See root cause above. "
                "Failed core proc(s): {'EngineCore': 1}",
            )
            self.exit_code = 1
            return False
        log.engine(f"GPU KV cache size: {mem.kv_tokens:,} tokens", "kv_cache_utils.py:2146")
        log.engine(
            f"Maximum concurrency for {s.max_model_len:,} tokens per request: "
            f"{mem.max_concurrency:.2f}x",
            "kv_cache_utils.py:2151",
        )
        if await self.pause(env_float(self.env, "TUNER_SIM_STARTUP_S", 0.0)):
            return False
        if graphs:
            n = len(r.capture_sizes)
            log.engine(
                f"Graph capturing finished in {max(1, round(n * 0.1)):.0f} secs, took "
                f"{mem.cudagraph_gib:.2f} GiB",
                "gpu_model_runner.py:6660",
            )
        init_s = compile_s + 3.0 + 0.1 * len(r.capture_sizes)
        log.engine(
            f"init engine (profile, create kv cache, warmup model) took {init_s:.2f} s "
            f"(compilation: {compile_s:.2f} s)",
            "core.py:346",
        )
        return True

    def compile(self) -> float:
        """vLLM 0.24's torch.compile lines, with its cache: the folders go under
        ``VLLM_CACHE_ROOT`` (``~/.cache/vllm`` when unset: then nothing is written), keyed by
        :func:`compile_hashes`; an AOT artifact that exists is loaded (a hit). No time passes:
        the seconds logged are the model's. Returns the compilation seconds."""
        log = self.log
        env_root = self.env.get("VLLM_CACHE_ROOT")
        root = Path(env_root or Path("~/.cache/vllm").expanduser()) / "torch_compile_cache"
        config_hash, aot_hash = compile_hashes(self.s, VERSION)
        backbone = root / config_hash / "rank_0_0" / "backbone"
        aot = root / "torch_aot_compile" / aot_hash / "rank_0_0" / "model"
        full_s = 18.0 + self.s.resolved.max_num_batched_tokens / 2048
        log.engine(
            f"Using cache directory: {backbone} for vLLM's torch.compile", "backends.py:1089"
        )
        if aot.is_dir():
            log.engine(f"Directly load AOT compilation from path {aot}", "decorators.py:312")
            compile_s = round(full_s * 0.1, 2)
        else:
            log.engine(f"Dynamo bytecode transform time: {full_s * 0.4:.2f} s", "backends.py:1148")
            log.engine(
                f"Compiling a graph for compile range (1, {self.s.resolved.max_num_batched_tokens})"
                f" takes {full_s * 0.55:.2f} s",
                "backends.py:393",
            )
            if env_root:
                backbone.mkdir(parents=True, exist_ok=True)
                aot.mkdir(parents=True, exist_ok=True)
            log.engine(f"saved AOT compiled function to {aot}", "decorators.py:708")
            compile_s = full_s
        log.engine(f"torch.compile took {compile_s:.2f} s in total", "monitor.py:53")
        return compile_s

    # ---------------------------------------------------------------- HTTP

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            # the tokenizer vLLM would count with, and the model's chat template it renders
            from tuner.workload.prompts import ChatTemplate, load_tokenizer, segment_encoder

            self._template = ChatTemplate(self.s.model_dir)
            self._tokenizer = load_tokenizer(self.s.model_dir)
            self._segments = segment_encoder(self._tokenizer)
        return self._tokenizer

    def encode(self, text: str, special: bool) -> list[int]:
        return list(self.tokenizer().encode(text, add_special_tokens=special).ids)

    def check_model(self, body: Mapping[str, Any]) -> str:
        name = body.get("model")
        if name is None:
            return self.s.served_names[0]
        if name not in self.s.served_names:
            raise ApiError(404, f"The model `{name}` does not exist.", "NotFoundError")
        return str(name)

    def image_tokens(self, part: Mapping[str, Any]) -> list[int]:
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, Mapping) else url
        if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
            raise ApiError(400, "Only base64 data URLs are supported for now.")
        raw = url.split(";base64,", 1)[1]
        try:
            data = base64.b64decode(raw, validate=False)
            from PIL import Image

            with Image.open(io.BytesIO(data)) as img:
                w, h = img.size
        except (binascii.Error, OSError, ValueError) as exc:
            raise ApiError(400, f"Failed to load image: {exc}") from exc
        n = image_tokens(w, h, self.image_grid)
        seed = int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "big")
        return [200_000 + (seed + i) % 50_000 for i in range(n)]

    def chat_tokens(self, messages: Any) -> list[int]:
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list")
        rendered: list[dict[str, str]] = []
        images: list[int] = []
        count = 0
        for msg in messages:
            if not isinstance(msg, Mapping):
                raise ApiError(400, "each message must be an object")
            content = msg.get("content")
            if content is None:
                content = ""
            if isinstance(content, list):
                texts = []
                for part in content:
                    kind = part.get("type") if isinstance(part, Mapping) else None
                    if kind == "text":
                        texts.append(str(part.get("text", "")))
                    elif kind == "image_url":
                        count += 1
                        if count > self.s.image_limit:
                            raise ApiError(
                                400,
                                f"At most {self.s.image_limit} image(s) may be provided in "
                                "one prompt.",
                            )
                        images += self.image_tokens(part)
                    else:
                        raise ApiError(400, f"Unknown part type: {kind}")
                content = "\n".join(texts)
            rendered.append({"role": str(msg.get("role", "user")), "content": str(content)})
        self.tokenizer()
        # as vLLM: the model's chat template with the generation prompt, encoded without adding
        # special tokens (the template writes its own); each image's tokens after the text
        assert self._segments is not None
        return self._segments.encode(self._template.render(rendered)) + images

    def check_length(self, n_prompt: int, max_tokens: int) -> None:
        mml = self.s.max_model_len
        if n_prompt + max_tokens > mml:
            raise ApiError(
                400,
                f"This model's maximum context length is {mml} tokens. However, you requested "
                f"{max_tokens} output tokens and your prompt contains {n_prompt} input tokens, "
                f"for a total of {n_prompt + max_tokens} tokens. Please reduce the length of "
                "the input prompt or the number of requested output tokens.",
            )

    def stall_at_request(self) -> None:
        """``TUNER_SIM_STALL=N:S``: when the N-th generate request arrives, block this process
        for S seconds, as a host that stops the server once (another process on its core, a
        swap): the engine's tokens then leave late, and its lag metrics say so. Several stalls
        are comma-separated (``50:1,180:2``)."""
        self.requests_seen += 1
        if self.requests_seen in self.stalls:  # blocking on purpose: the whole server stalls
            time.sleep(self.stalls[self.requests_seen])

    async def handle_generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        engine = self.engine
        assert engine is not None
        self.stall_at_request()
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ApiError(400, f"Invalid JSON body: {exc}") from exc
            if not isinstance(body, dict):
                raise ApiError(400, "The request body must be a JSON object.")
            model = self.check_model(body)
            if chat:
                tokens = self.chat_tokens(body.get("messages"))
                max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
                if max_tokens is None:
                    max_tokens = max(1, self.s.max_model_len - len(tokens))
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                    prompt = prompt[0]
                if isinstance(prompt, str):
                    tokens = self.encode(prompt, special=True)
                elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                    tokens = list(prompt)
                else:
                    raise ApiError(400, "prompt must be a string or a list of token ids")
                max_tokens = body.get("max_tokens", 16)
                if max_tokens is None:
                    max_tokens = max(1, self.s.max_model_len - len(tokens))
            if not isinstance(max_tokens, int) or max_tokens < 1:
                raise ApiError(400, "max_tokens must be at least 1, got {max_tokens}.")
            if not tokens:
                raise ApiError(400, "The prompt cannot be empty.")
            self.check_length(len(tokens), max_tokens)
            stream = bool(body.get("stream", False))
            opts = body.get("stream_options")
            if opts is not None and not stream:
                raise ApiError(400, "Stream options can only be defined when `stream=True`.")
            usage_on = bool(isinstance(opts, Mapping) and opts.get("include_usage"))
            if engine.dead:
                raise EngineDeadError()
        except ApiError as exc:
            return exc.response()
        except EngineDeadError as exc:
            return ApiError(500, str(exc), "InternalServerError").response()
        prefix = "chatcmpl-" if chat else "cmpl-"
        meta = {"id": prefix + uuid.uuid4().hex, "created": int(time.time()), "model": model}
        if stream:
            return await self._stream(request, engine, meta, tokens, max_tokens, chat, usage_on)
        produced = 0
        due = 0.0
        try:
            async for n, when in engine.generate(tokens, max_tokens):
                produced, due = produced + n, when
        except EngineDeadError as exc:
            return ApiError(500, str(exc), "InternalServerError").response()
        engine.lag.record(due)
        said = answers.output(
            answers.prompt_text(body.get("messages") if chat else body.get("prompt")),
            produced,
            self.numerics,
            loss=env_float(self.env, "TUNER_SIM_ANSWER_LOSS", 0.0),
            alternatives=_top_logprobs(body),
        )
        text = said.text
        logprobs = (
            said.chat_logprobs(_top_logprobs(body)) if chat and body.get("logprobs") else None
        )
        usage = _usage(len(tokens), produced)
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "reasoning_content": None,
                    "tool_calls": [],
                },
                "logprobs": logprobs,
                "finish_reason": "length",
                "stop_reason": None,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "prompt_logprobs": None,
            }
            obj = "text_completion"
        return web.json_response({**meta, "object": obj, "choices": [choice], "usage": usage})

    async def _stream(
        self,
        request: web.Request,
        engine: AsyncEngine,
        meta: dict[str, Any],
        tokens: list[int],
        max_tokens: int,
        chat: bool,
        usage_on: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        # every chunk is {**meta, "object": obj, "choices": [choice], "usage": ...}: the parts
        # that do not change are encoded once
        head = json.dumps({**meta, "object": obj}, separators=(",", ":"))[:-1] + ',"choices":'
        tail = ',"usage":null}' if usage_on else "}"

        async def send(choice: dict[str, Any] | None, usage: Any = None) -> None:
            body = json.dumps([choice] if choice else [], separators=(",", ":"))
            end = (
                "," + json.dumps({"usage": usage}, separators=(",", ":"))[1:]
                if usage is not None
                else tail
            )
            await resp.write(f"data: {head}{body}{end}\n\n".encode())

        produced = 0
        try:
            async for n, due in engine.generate(tokens, max_tokens):
                if chat and produced == 0:
                    await send(
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    )
                text = "".join(WORDS[(produced + i) % len(WORDS)] for i in range(n))
                produced += n
                finish = "length" if produced >= max_tokens else None
                if chat:
                    choice = {
                        "index": 0,
                        "delta": {"content": text},
                        "logprobs": None,
                        "finish_reason": finish,
                    }
                else:
                    choice = {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                    }
                if finish:
                    choice["stop_reason"] = None
                await send(choice)
                engine.lag.record(due)
            if usage_on:
                await send(None, _usage(len(tokens), produced))
        except EngineDeadError as exc:
            err = {
                "error": {
                    "message": str(exc),
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            }
            await resp.write(f"data: {json.dumps(err)}\n\n".encode())
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def make_app(self) -> web.Application:
        key = self.args.api_key or self.env.get("VLLM_API_KEY")

        @web.middleware
        async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
            if (
                key
                and request.path.startswith("/v1")
                and request.headers.get("Authorization") != f"Bearer {key}"
            ):
                return web.json_response({"error": "Unauthorized"}, status=401)
            resp: web.StreamResponse = await handler(request)
            return resp

        app = web.Application(middlewares=[auth], client_max_size=256 * 1024 * 1024)

        async def health(_: web.Request) -> web.Response:
            dead = self.engine is None or self.engine.dead
            return web.Response(status=503 if dead else 200)

        async def models(_: web.Request) -> web.Response:
            data: list[dict[str, Any]] = [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": str(self.args.model_tag),
                    "parent": None,
                    "max_model_len": self.s.max_model_len,
                    "permission": [],
                }
                for name in self.s.served_names
            ]
            return web.json_response({"object": "list", "data": data})

        async def version(_: web.Request) -> web.Response:
            return web.json_response({"version": VERSION})

        async def metrics(_: web.Request) -> web.Response:
            assert self.engine is not None
            if self.spec is not None:
                self.spec.update(self.engine.stats().generation_tokens)
            self.engine.lag.publish_max()
            body = generate_latest(self.engine.metrics.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def completions(request: web.Request) -> web.StreamResponse:
            return await self.handle_generate(request, chat=False)

        async def chat(request: web.Request) -> web.StreamResponse:
            return await self.handle_generate(request, chat=True)

        async def reset_prefix_cache(_: web.Request) -> web.Response:
            assert self.engine is not None
            if not self.engine.reset_prefix_cache():
                raise web.HTTPInternalServerError(text="Failed to reset prefix cache")
            return web.Response(status=200)

        async def reset_mm_cache(_: web.Request) -> web.Response:
            return web.Response(status=200)  # the simulator keeps no multimodal cache

        if self.env.get("VLLM_SERVER_DEV_MODE", "0") in ("1", "true", "True"):
            # vLLM mounts its cache-reset routes only in dev mode (serve/dev/cache/api_router.py)
            app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
            app.router.add_post("/reset_mm_cache", reset_mm_cache)
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/version", version)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/v1/completions", completions)
        app.router.add_post("/v1/chat/completions", chat)
        return app

    async def die_later(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.log.engine("EngineCore encountered a fatal error.", "core.py:1234", "ERROR")
        if self.engine is not None:
            self.engine.kill()
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
        self.log.api(
            "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
            "core_client.py:705",
            "ERROR",
        )
        await asyncio.sleep(DEATH_EXIT_S)
        self.log.api("Engine failed, terminating server.", "launcher.py:170", "ERROR")
        self.stop.set()


def _top_logprobs(body: Mapping[str, Any]) -> int:
    n = body.get("top_logprobs")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
    }


LISTEN_BACKLOG = 2048
"""The listen queue: vLLM's, as uvicorn listens on the socket vLLM's ``serve_http`` hands it
(``server.serve(sockets=[sock])``; uvicorn's ``Config.backlog`` defaults to 2048), not aiohttp's
128. A closed loop's first round opens a connection per slot at once (500 for chat's confirm
steps): with 128, the connections past it were dropped and retried by the kernel a second later,
6 s of the modelled GPU's time at speed-up 6, so a step's first round reached the engine late and
its counted requests ran under less load than the loop's (docs/sim-calibration.md)."""


def _bind(host: str, port: int) -> socket.socket:
    """Bind now (like vLLM) but listen only once ready: connections are refused until then."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock


async def _run(args: SimArgs, s: Settings, env: Mapping[str, str], log: SimLog) -> int:
    srv = _Server(args, s, env, log)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, srv.stop.set)
    host = args.host or "0.0.0.0"
    log.api(f"Using max model len {s.max_model_len}", "model.py:1725")
    try:
        sock = _bind(host, args.port)
    except OSError as exc:
        log.api_traceback([], f"OSError: [Errno {exc.errno}] {exc.strerror}")
        return 1
    runner: web.AppRunner | None = None
    tokenizer = loop.run_in_executor(None, srv.tokenizer)
    try:
        if not await srv.start_engine():
            return srv.exit_code
        srv.engine = AsyncEngine(
            s,
            speedup=env_float(env, "TUNER_SIM_SPEEDUP", 1.0),
            stream_interval=args.stream_interval,
            stream_ms=env_float(env, "TUNER_SIM_STREAM_MS", 0.0),
            log=log,
            log_stats=not args.disable_log_stats,
        )
        srv.engine.start()
        if args.speculative_config:  # its counters on /metrics (tuner.sim.answers)
            labels = {"model_name": s.served_names[0], "engine": "0"}
            srv.spec = answers.SpecDecodeMetrics(
                srv.engine.metrics.registry, labels, args.speculative_config
            )
        await tokenizer
        log.api("Supported tasks: ['generate']", "api_server.py:577")
        log.api(f"Starting vLLM server on http://{host}:{args.port}", "api_server.py:581")
        # a client that disconnects cancels its handler, which aborts its request in the engine
        # (vLLM's routes do the same, ``with_cancellation``): a replay stopped early leaves no
        # queue of orphans behind
        runner = web.AppRunner(
            srv.make_app(), access_log=None, handle_signals=False, handler_cancellation=True
        )
        await runner.setup()
        await web.SockSite(runner, sock, backlog=LISTEN_BACKLOG).start()
        log.api(f"Started server process [{os.getpid()}]", "server.py:83")
        log.api("Waiting for application startup.", "on.py:48")
        log.api("Application startup complete.", "on.py:62")
        die = env.get("TUNER_SIM_DIE_AFTER_S")
        death = asyncio.create_task(srv.die_later(float(die))) if die else None
        await srv.stop.wait()
        if death is not None:
            death.cancel()
        log.api("[shutdown] API server: shutdown triggered", "launcher.py:107")
        return srv.exit_code
    finally:
        srv.stop_engine_core()
        if srv.engine is not None:
            srv.engine.kill()
            await srv.engine.stop()
        if runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runner.cleanup(), 0.5)
        sock.close()
