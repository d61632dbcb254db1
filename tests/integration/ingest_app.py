"""The app behind the ingest topic's tests: a typed handler, so its agent registers the
payload's Avro schema (subject ``ingest-shop.signup-value``) that producers serialize with."""

from __future__ import annotations

import dataclasses

import conveyor

app = conveyor.App("ingest-shop")


@dataclasses.dataclass
class Signup:
    email: str
    seats: int
    plan: str = "free"


@app.task(queue="signups")
def signup(ctx: conveyor.Context, s: Signup) -> dict[str, object]:
    return {"email": s.email, "seats": s.seats, "plan": s.plan}


@app.task(queue="signups")
def signup_fuzz(ctx: conveyor.Context, s: Signup) -> str:
    return s.email


@app.task(queue="signups")
def signup_kill(ctx: conveyor.Context, s: Signup) -> str:
    return s.email


@dataclasses.dataclass
class Refund:
    order_id: str
    cents: int


@app.task
def refund(ctx: conveyor.Context, r: Refund) -> str:
    return r.order_id
