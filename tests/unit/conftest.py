"""Loopback HTTP servers for the unit tests: ``serve_app`` for any aiohttp app, and the fake vLLM
server the replay tests share (``test_replay``, ``test_replay_procs``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from helpers.fake_vllm import FakeVLLM


@contextlib.asynccontextmanager
async def _serve(app: web.Application) -> AsyncIterator[str]:
    srv = TestServer(app, host="127.0.0.1", port=0)
    await srv.start_server()
    try:
        yield str(srv.make_url("")).rstrip("/")
    finally:
        await srv.close()


@pytest.fixture
def serve_app() -> Callable[[web.Application], AbstractAsyncContextManager[str]]:
    """``async with serve_app(app) as base_url``: ``app`` on a free loopback port."""
    return _serve


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, FakeVLLM]]:
    fake = FakeVLLM()
    app = web.Application()
    app.router.add_post("/v1/completions", fake.handle)
    app.router.add_post("/v1/chat/completions", fake.handle)
    async with _serve(app) as base:
        yield base, fake
