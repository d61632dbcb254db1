"""Late leases: granted after the poll that claimed them was answered, kept for the agent.

A poll is answered soon after it holds a lease (``pool.WaitingPool``), while other slots
it claimed may still be in GrantLeases records on their way through the log. Those leases are
granted all the same; they wait here, in the agent's mailbox, for its next poll.

Rule 1 (capacity): a poll never returns more leases than its capacity. It takes what its
mailbox holds first (at most its capacity; the rest stays for the poll after), and the slots
still in flight for the agent (``owed``) are reserved out of its capacity: it is dealt only
``capacity - late - owed`` fresh slots, and a late lease that arrives while it waits fills a
reserved slot. An agent that polls with its free slots therefore never holds more leases
than it has slots, even though an answer no longer accounts for every slot it asked for.
Rule 2 (nothing is stranded): every late lease either reaches one of the agent's later polls
or lapses. An agent that never polls again (or polls as something else: the mailbox is keyed
by agent id, app, version, tenants and queues) costs its late leases their lease interval:
they lapse like a crashed agent's (ExpireLeases -> RETRY_WAIT, attempt + 1, retried, never
lost). Leases that are no longer live are dropped when a poll looks, and mailboxes holding
nothing live are swept.
Rule 3 (a poll that goes away): a poll cancelled by its caller (the agent hung up) puts the
leases it held into the mailbox too, so a reconnecting agent still gets them.
Rule 4 (the lease interval starts at delivery): a late lease taken by a poll of its agent
counts as heartbeated then (``touch``): the agent is alive and polling, and the time the lease
spent here, unseen by it, must not eat into the interval it has for its first heartbeat
(``conveyor chaos zombie`` N1 caught a lease granted while its agent was stopped for half a
lease, delivered after it resumed and lapsed before its first heartbeat).

What it costs: a lease can sit here for up to one poll round trip of the agent before it
starts, and the attempts of an agent that disappears right
after a poll are retried only after their lease interval, as if it had crashed holding them.
"""

from __future__ import annotations

from collections.abc import Callable

from conveyor.streams.processor.slots import AgentKey, Lease

SWEEP_EVERY_MS = 1_000.0


class Mailboxes:
    """The mailboxes of one node's waiting pool: the late leases granted for each agent key,
    for its next polls. ``live(lease)``: the lease is still the task's live lease on a leading
    partition (else it is dropped, rule 2); ``touch(lease)``: restart its interval (rule 4).
    The slots still in flight for a key (``owed``) are counted by the slot ledger
    (``slots.py``), with every other slot."""

    def __init__(self, live: Callable[[Lease], bool], touch: Callable[[Lease], None]) -> None:
        self._live = live
        self._touch = touch
        self._boxes: dict[AgentKey, list[Lease]] = {}
        self._swept_ms = 0.0

    def __len__(self) -> int:
        return len(self._boxes)

    def held(self, key: AgentKey) -> int:
        return len(self._boxes.get(key, ()))

    def take(self, key: AgentKey, capacity: int) -> list[Lease]:
        """Up to ``capacity`` live late leases for ``key``, oldest first (rule 1)."""
        box = self._boxes.get(key)
        if box is None or capacity <= 0:
            return []
        box = [lease for lease in box if self._live(lease)]
        taken, box = box[:capacity], box[capacity:]
        self._put(key, box)
        for lease in taken:
            self._touch(lease)
        return taken

    def keep(self, key: AgentKey, leases: list[Lease]) -> None:
        """Leases granted for an answered poll, or that a cancelled poll held (rule 3)."""
        if leases:
            self._boxes.setdefault(key, []).extend(leases)

    def sweep(self, now_ms: float) -> None:
        """Drop leases no longer live, and mailboxes left with nothing (at most once a
        second: the cost is one check per late lease)."""
        if now_ms - self._swept_ms < SWEEP_EVERY_MS or not self._boxes:
            return
        self._swept_ms = now_ms
        for key, box in list(self._boxes.items()):
            self._put(key, [lease for lease in box if self._live(lease)])

    def _put(self, key: AgentKey, box: list[Lease]) -> None:
        if box:
            self._boxes[key] = box
        else:
            del self._boxes[key]
