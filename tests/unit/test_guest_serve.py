"""The guest stub's serve loop (``conveyor.agents.guest``), over a real socketpair with the
agent's side played by the test: a job queued behind a running one and withdrawn before the
guest looked again must not end the guest (it exited with code 0, and the agent failed the next
job it had handed it as GuestCrashed: ``conveyor chaos zombie`` N1 found it)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import conveyor
from conveyor.agents.frames import BlockingFrames
from conveyor.agents.guest import Guest

app = conveyor.App("guest-serve")


@app.task
def sleepy(ctx: conveyor.Context, seconds: float) -> str:
    time.sleep(seconds)  # reads no frame meanwhile: they wait in the socket
    return "slept"


@app.task
def echo(ctx: conveyor.Context, payload: Any) -> Any:
    return payload


def run_frame(task_id: str, task_type: str, payload: Any) -> dict[str, Any]:
    return {"op": "run", "task_id": task_id, "task_type": task_type, "attempt": 1,
            "payload": payload}  # fmt: skip


def test_a_withdrawn_queued_job_does_not_end_the_guest() -> None:
    agent_end, guest_end = socket.socketpair()
    agent_end.settimeout(5.0)  # a guest that ended answers nothing: fail, do not hang
    agent = BlockingFrames(agent_end)
    guest = Guest(app, BlockingFrames(guest_end))
    serving = threading.Thread(target=guest.serve, daemon=True)
    serving.start()
    agent.send(run_frame("a" * 32, "sleepy", 0.3))
    agent.send(run_frame("b" * 32, "echo", "queued"))  # queued behind the sleeper
    time.sleep(0.1)  # the sleeper runs: the withdraw is read only once it is done
    agent.send({"op": "withdraw", "task_id": "b" * 32})
    replies = [agent.recv(), agent.recv()]
    assert {(r or {}).get("op") for r in replies} == {"done", "withdrawn"}, replies
    agent.send(run_frame("c" * 32, "echo", "after"))  # the agent hands it the next job
    done = agent.recv()
    assert done is not None and done["op"] == "done" and done["task_id"] == "c" * 32, done
    assert done["result"] == "after"
    assert serving.is_alive()
    agent.send({"op": "exit"})
    serving.join(timeout=5)
    assert not serving.is_alive()
    agent_end.close()
    guest_end.close()


def test_a_withdraw_that_came_while_the_job_ahead_ran_is_answered_before_its_done() -> None:
    agent_end, guest_end = socket.socketpair()
    agent_end.settimeout(5.0)  # a guest that ended answers nothing: fail, do not hang
    agent = BlockingFrames(agent_end)
    serving = threading.Thread(target=Guest(app, BlockingFrames(guest_end)).serve, daemon=True)
    serving.start()
    try:
        agent.send(run_frame("a" * 32, "sleepy", 0.5))
        agent.send(run_frame("b" * 32, "echo", "queued"))  # queued behind the sleeper
        time.sleep(0.1)  # the sleeper runs
        agent.send({"op": "withdraw", "task_id": "b" * 32})
        replies = [agent.recv() or {}, agent.recv() or {}]
        ops = [(r.get("op"), r.get("task_id")) for r in replies]
        assert ops == [("withdrawn", "b" * 32), ("done", "a" * 32)], (
            f"the guest answered {ops}: the agent, reading the done first, would take the "
            "withdrawn job for started"
        )
        agent.send({"op": "exit"})
        serving.join(timeout=5)
        assert not serving.is_alive()
    finally:
        agent_end.close()
        guest_end.close()
