"""An app whose payloads cross the platform encrypted (``test_codecs_node.py``): its guests
decode and encode with the tenant's key, which only this module (the user's code) holds."""

from __future__ import annotations

import hashlib
from typing import Any

import conveyor
from conveyor.codecs import Chain, Compression, Encryption, Keys

# A test key derived from a fixed phrase; a real app reads its keys from its own secret store.
KEYS = Keys(
    {"tenant-key-1": hashlib.sha256(b"codec-app test key").digest()}, current="tenant-key-1"
)
CODEC = Chain(Compression(threshold_bytes=256), Encryption(KEYS))

app = conveyor.App("codec-app", codec=CODEC)


@app.task
def seal(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Checkpoints and steps secrets, then reports what it was given, as it saw it."""
    ctx.checkpoint({"stage": payload["secret"] + "-checkpoint"})
    card = ctx.step.run("card", lambda: payload["secret"] + "-step")
    return {"saw": payload, "card": card, "checkpoint": ctx.last_checkpoint}


@app.workflow
def approval(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Stays WAITING with its committed step until the event comes."""
    ctx.step.run("quote", lambda: payload["secret"] + "-quote")
    decision = ctx.wait_for_event("approved")
    return {"decision": decision}


@app.task
async def shout(note: str) -> str:
    """An async handler: in a guest it runs on the guest's event loop."""
    return note.upper()
