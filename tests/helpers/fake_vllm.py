"""The fake vLLM server of the replay tests (``tests/unit/test_replay*.py``; ``tests/unit/conftest.py``
serves it as the ``server`` fixture), and the request specs and replay call they send it."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from tuner.config import ArrivalConfig
from tuner.records import RequestRecord, RequestSpec
from tuner.replay import replay


class FakeVLLM:
    """Streams ``n`` content chunks; the request body's ``x_mode`` picks a failure."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.received: list[tuple[float, dict[str, Any], dict[str, str]]] = []
        self.peers: list[Any] = []
        self.in_flight_at_receipt: list[int] = []
        self.t0 = time.perf_counter()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append((time.perf_counter(), body, dict(request.headers)))
        self.peers.append(
            request.transport.get_extra_info("peername") if request.transport else None
        )
        self.in_flight += 1
        self.in_flight_at_receipt.append(self.in_flight)
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._respond(request, body)
        finally:
            self.in_flight -= 1

    async def _respond(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        mode = body.get("x_mode", "ok")
        chat = request.path.endswith("/chat/completions")
        if mode == "http500":
            return web.json_response(
                {"error": {"message": "boom: engine dead", "type": "InternalServerError"}},
                status=500,
            )
        if mode == "http400_text":
            return web.Response(status=400, text="bad request text")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj: Any) -> None:
            await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

        n = int(body.get("max_tokens", 4))
        await asyncio.sleep(float(body.get("x_ttft", 0.0)))
        if chat:  # vLLM sends a role-only chunk first
            await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for i in range(n):
            if mode == "midstream_error" and i == 2:
                await send({"error": {"message": "mid-stream failure", "code": 500}})
                await resp.write(b"data: [DONE]\n\n")
                return resp
            if i:
                await asyncio.sleep(float(body.get("x_itl", 0.0)))
            if mode == "hang" and i == 1:
                await asyncio.sleep(30)
            if chat:
                await send({"choices": [{"index": 0, "delta": {"content": f" t{i}"}}]})
            else:
                await send({"choices": [{"index": 0, "text": f" t{i}"}]})
        final = {"index": 0, "finish_reason": "length"}
        final.update({"delta": {"content": ""}} if chat else {"text": ""})
        await send({"choices": [final]})
        if body.get("stream_options", {}).get("include_usage"):
            usage = {"prompt_tokens": 11, "completion_tokens": n, "total_tokens": 11 + n}
            await send({"choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        # the body's end (chunked encoding's last chunk) may come in a later segment
        await asyncio.sleep(float(body.get("x_tail", 0.0)))
        return resp


def spec(
    i: int,
    *,
    endpoint: str = "completions",
    arrival_s: float | None = None,
    warmup: bool = False,
    **extra: Any,
) -> RequestSpec:
    body: dict[str, Any] = {"max_tokens": 4, "ignore_eos": True, **extra}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return RequestSpec(
        index=i,
        endpoint=endpoint,  # type: ignore[arg-type]
        body=body,
        prompt_tokens=11,
        output_tokens=int(body["max_tokens"]),
        arrival_s=arrival_s,
        warmup=warmup,
    )


CLOSED = ArrivalConfig(kind="concurrency", concurrency=2)


async def run(
    base: str, specs: list[RequestSpec], arrival: ArrivalConfig = CLOSED, **kw: Any
) -> list[RequestRecord]:
    kw.setdefault("duration_s", 60.0)
    kw.setdefault("request_timeout_s", 10.0)
    return await replay(base, "m", specs, arrival, **kw)
