"""Small asyncio helpers shared by the pipeline stages."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has stopped; its cancellation is not re-raised (any
    other exception it ends with is)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
