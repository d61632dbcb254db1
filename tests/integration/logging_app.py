"""Handlers that log, run by the log tests in real guests (``logging_app:app``)."""

from __future__ import annotations

import asyncio
import logging

import conveyor

app = conveyor.App("logging-tests")
library = logging.getLogger("some.library")  # a logger that knows nothing of Conveyor


@app.task
def chatty(ctx: conveyor.Context, payload: str) -> str:
    ctx.logger.info("hello from %s", payload)
    library.warning("library line for %s", payload)
    return payload


@app.task(concurrency=4)
async def chatty_async(ctx: conveyor.Context, payload: str) -> str:
    """Four of these interleave on one loop: each line keeps its own attempt's fields."""
    for step in range(3):
        library.warning("async %s step %d", payload, step)
        await asyncio.sleep(0.05)
    return payload
