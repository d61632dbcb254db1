"""The app of ``test_testing_parity.py``: run by ``conveyor.testing.Engine`` and by a
``conveyor dev`` node's agent, which must answer its scenario alike."""

from __future__ import annotations

from typing import Any

import conveyor

app = conveyor.App("parity-tests")


@app.task
def double(x: int) -> int:
    return x * 2


@app.task(retry=conveyor.Retry(attempts=1))
def refuse(reason: str) -> None:
    raise conveyor.FatalError(f"refused: {reason}")


@app.workflow
def order(ctx: conveyor.Context, n: int) -> dict[str, Any]:
    reserved = ctx.step.run("reserve", lambda: {"reserved": n})
    (doubled,) = ctx.parallel("double", [(double, n)])
    return {"step": reserved, "child": doubled}
