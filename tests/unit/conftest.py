"""The fake vLLM server the replay tests share (``test_replay``, ``test_replay_procs``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from test_replay import FakeVLLM


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, FakeVLLM]]:
    fake = FakeVLLM()
    app = web.Application()
    app.router.add_post("/v1/completions", fake.handle)
    app.router.add_post("/v1/chat/completions", fake.handle)
    srv = TestServer(app, host="127.0.0.1", port=0)
    await srv.start_server()
    try:
        yield str(srv.make_url("")).rstrip("/"), fake
    finally:
        await srv.close()
