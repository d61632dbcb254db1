"""The agents a node has heard from, as their polls describe them: shown to operators
(``GET /v1/agents``, the dashboard's Agents page), never acted on.

Rules, and why:

1. A poll is the only report: its app, version, queues and task types, and how many slots it
   asks for (its free slots). The node does not know an agent's slots in all; the page shows
   the slots used (its tasks LEASED, from the snapshot) beside used + asked.
2. An agent is connected while a poll of its is waiting, or its last one ended less than
   ``GRACE_MS`` ago (an agent busy with its slots all used does not poll until one frees).
   After ``FORGET_MS`` without a poll it is forgotten: agents come and go with deploys, and
   the list must not grow with every pod that ever ran.
3. A node knows the polls it answered: on a cluster, each node lists the agents polling it.
"""

from __future__ import annotations

from typing import Any

from conveyor.frozen import frozen

GRACE_MS = 30_000
FORGET_MS = 15 * 60_000


@frozen(kw_only=True)
class _Seen:
    app: str
    version: str | None
    queues: tuple[str, ...]
    task_types: tuple[str, ...] | None
    asked: int  # free slots asked for by the last poll
    polled_ms: int  # wall clock of the last poll's start
    until_ms: int  # when that poll ends at the latest (its wait)
    polls: int


class SeenAgents:
    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], _Seen] = {}  # (tenant, agent id) ->

    def polled(
        self,
        tenant: str,
        agent_id: str,
        *,
        app: str,
        version: str | None,
        queues: list[str],
        task_types: frozenset[str] | None,
        capacity: int,
        wait_ms: int,
        now_ms: int,
    ) -> None:
        held = self._seen.get((tenant, agent_id))
        self._seen[(tenant, agent_id)] = _Seen(
            app=app,
            version=version,
            queues=tuple(sorted(queues)),
            task_types=None if task_types is None else tuple(sorted(task_types)),
            asked=capacity,
            polled_ms=now_ms,
            until_ms=now_ms + wait_ms,
            polls=1 if held is None else held.polls + 1,
        )

    def of_tenant(
        self, tenant: str, now_ms: int, running: dict[str, list[dict[str, Any]]] | None
    ) -> list[dict[str, Any]]:
        """The tenant's agents, by id, with their running tasks (``running``: by agent id, from
        the snapshot; None: not known)."""
        for key in [k for k, s in self._seen.items() if now_ms - s.until_ms > FORGET_MS]:
            del self._seen[key]
        out = []
        for (t, agent_id), s in sorted(self._seen.items()):
            if t != tenant:
                continue
            tasks = None if running is None else running.get(agent_id, [])
            used = None if tasks is None else len(tasks)
            out.append(
                {
                    "agent_id": agent_id,
                    "app": s.app,
                    "version": s.version,
                    "queues": list(s.queues),
                    "task_types": None if s.task_types is None else list(s.task_types),
                    "connected": now_ms <= s.until_ms + GRACE_MS,
                    "last_poll_ms": s.polled_ms,
                    "last_poll_age_ms": max(0, now_ms - s.polled_ms),
                    "polls": s.polls,
                    "slots_asked": s.asked,
                    "slots_used": used,
                    "running": tasks,
                }
            )
        for agent_id, tasks in sorted((running or {}).items()):  # polls of another node
            if (tenant, agent_id) not in self._seen:
                out.append(_unseen(agent_id, tasks))
        return out


def _unseen(agent_id: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """An agent holding leases that has not polled this node (since it started)."""
    return {
        "agent_id": agent_id,
        "app": tasks[0]["app"],
        "version": None,
        "queues": sorted({t["queue"] for t in tasks}),
        "task_types": None,
        "connected": False,
        "last_poll_ms": None,
        "last_poll_age_ms": None,
        "polls": 0,
        "slots_asked": None,
        "slots_used": len(tasks),
        "running": tasks,
    }
