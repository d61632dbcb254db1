"""What a leader duty may reach of its partition: the ``Partition`` protocol.

The leader duties (``dispatch.py``, ``leases.py``, ``timers.py``, ``outbox.py``,
``messages.py``) run beside a partition's apply loop while it leads. They reach it through this
narrow interface only, never through a back-reference into the processor (``loop.py``
implements it): propose a leader record and wait for it to be applied, read committed state,
the clock, the epoch and whether it still leads. So the processor can change how it applies,
leads or hands a partition over without touching the duties, and a duty can be driven by a
test double of a few lines.

Rule 1: a duty MUST stop when ``leader`` turns False (the processor stepped down, was fenced or
is stopping) and MUST NOT write partition state: everything it decides is a record it
proposes, applied by the machine like any other.
Rule 2: ``reader()`` is committed state, for reads between batches; a duty never holds it
across an ``await`` expecting it to stay current.
Rule 3: ``propose`` raises ``LogSealed`` when the partition is no longer the leader (and steps
down), a ``TransientError`` when nothing was written; a duty backs off on the second and ends
its round on the first.

Import rule: the duties import this module, never ``loop.py``; ``loop.py`` imports them. There
is no import cycle among the processor's modules (``tests/unit/test_layering.py`` checks it).
"""

from __future__ import annotations

from typing import Protocol

from conveyor.schemas.types import Record
from conveyor.store.tables import Tables
from conveyor.streams.clock import Clock


class Partition(Protocol):
    """One partition, as its leader duties see it."""

    @property
    def partition(self) -> int: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def epoch(self) -> int:
        """The epoch this processor leads at (its proposals carry it)."""
        ...

    @property
    def leader(self) -> bool:
        """Leading now: duties run while this holds (rule 1)."""
        ...

    @property
    def applied(self) -> int:
        """The offset of the last record applied and committed."""
        ...

    @property
    def halted(self) -> BaseException | None:
        """Why the partition stopped applying records, or None while it runs."""
        ...

    def reader(self) -> Tables:
        """Committed state (rule 2)."""
        ...

    async def propose(self, record: Record) -> int:
        """Append a leader record under this leader's epoch; its offset (rule 3)."""
        ...

    async def wait_applied(self, offset: int) -> None:
        """Until the record at ``offset`` is applied and committed."""
        ...
