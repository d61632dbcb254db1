"""Enqueue from a FastAPI app: one ``conveyor.AsyncClient`` for the app's lifetime.

    conveyor dev --app examples.shop:app                 # a node and an agent for the shop
    CONVEYOR_URL=http://127.0.0.1:7070 CONVEYOR_API_KEY=... \\
        uvicorn examples.fastapi_app:web --port 8000
    curl -X POST localhost:8000/receipts -H 'content-type: application/json' \\
        -d '{"order": 7, "email": "ada@example.com"}'    # {"task_id": "..."}
    curl localhost:8000/tasks/<task_id>                  # {"status": "SUCCEEDED", ...}

The client is made in the lifespan and closed when the app stops: its connection pool is
shared by every request, and no request pays for a connection of its own. It reads
``CONVEYOR_URL`` and ``CONVEYOR_API_KEY`` (``conveyor dev`` prints both). A request handler
only enqueues and answers 202 with the task id: the work runs on the agents, durably, whether
or not the web process lives on. (FastAPI and uvicorn are not dependencies of Conveyor.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

import conveyor
from conveyor.errors import NotFound
from examples import shop


@asynccontextmanager
async def lifespan(web: FastAPI) -> AsyncIterator[None]:
    async with conveyor.AsyncClient() as client:
        web.state.conveyor = client
        yield


web = FastAPI(title="shop front", lifespan=lifespan)


class Receipt(BaseModel):
    order: int
    email: str


def client_of(request: Request) -> conveyor.AsyncClient:
    client: conveyor.AsyncClient = request.app.state.conveyor
    return client


@web.post("/receipts", status_code=202)
async def send_receipt(receipt: Receipt, request: Request) -> dict[str, Any]:
    # The order number keys the enqueue: a client that retries its POST gets the same task.
    handle = await client_of(request).enqueue(
        shop.send_receipt, receipt.model_dump(), idempotency_key=f"receipt-{receipt.order}"
    )
    return {"task_id": handle.id, "created": handle.created}


@web.get("/tasks/{task_id}")
async def task(task_id: str, request: Request) -> dict[str, Any]:
    try:
        info = await client_of(request).get(task_id)
    except NotFound as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from exc
    return {"status": info.status, "attempt": info.attempt, "result": info.result}
