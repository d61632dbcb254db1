"""A Faust app that reacts to tasks reaching a terminal state, from a tenant's task events
topic (``conveyor node --kafka ... --task-events``; ``conveyor.faust``).

    pip install --no-deps faust-streaming mode-streaming aiohttp-cors \\
        intervaltree terminaltables venusian colorlog mypy-extensions six
    CONVEYOR_KAFKA=HOST:9092 CONVEYOR_CLUSTER=prod CONVEYOR_TENANT=acme \\
    CONVEYOR_URL=http://node:7400 CONVEYOR_API_KEY=cvk_... \\
        python -m examples.task_events_faust worker -l info

Each task that ends prints one JSON line: its id, type, how it ended and, for a failure, the
error class. A real app would page someone, bill, or start what comes next; the events come
at least once, so it keeps what it did by (task_id, version).
"""

from __future__ import annotations

import json
import os

import faust

from conveyor.faust import TaskEvent, task_events_topic

app = faust.App(
    os.environ.get("CONVEYOR_FAUST_APP", "conveyor-terminal-states"),
    broker=f"kafka://{os.environ.get('CONVEYOR_KAFKA', '127.0.0.1:9092')}",
    store="memory://",
    web_enabled=False,
    topic_disable_leader=True,
)
events = task_events_topic(
    app,
    cluster=os.environ.get("CONVEYOR_CLUSTER", "conveyor"),
    tenant=os.environ.get("CONVEYOR_TENANT", "default"),
    registry_url=os.environ.get("CONVEYOR_URL", "http://127.0.0.1:7400") + "/registry",
    api_key=os.environ.get("CONVEYOR_API_KEY", ""),
)
seen: set[tuple[str, int]] = set()  # (task_id, version): each ending handled once


@app.agent(events)
async def terminal_states(stream: faust.Stream[TaskEvent]) -> None:
    async for event in stream:
        if not event.terminal or (event.task_id, event.version) in seen:
            continue
        seen.add((event.task_id, event.version))
        ended = {"task_id": event.task_id, "task_type": event.task_type, "kind": event.kind}
        if event.error_class is not None:
            ended["error_class"] = event.error_class
        print(json.dumps(ended), flush=True)


if __name__ == "__main__":
    app.main()
