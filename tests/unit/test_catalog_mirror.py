"""A node that does not lead a tenant's registry partition reads and writes its catalog
through a mirror of that partition's log (``streams/registry/catalog.py`` rules 2 and 3): a
real node leads the partition on a memory log, and a mirror of the same log, as a second node
of the cluster would keep, sees what the leader applied and writes what the leader applies."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from conveyor.errors import TransientError
from conveyor.schemas.types import RegisterTypes, TypeDefinition
from conveyor.store.catalog import Catalog
from conveyor.store.memory import MemoryKV
from conveyor.streams.clock import FakeClock
from conveyor.streams.gateway.registry import Registry
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.node import Node
from conveyor.streams.registry.catalog import Mirror, registry_partition


async def _until(check: Callable[[Catalog], bool], mirror: Mirror) -> Catalog:
    for _ in range(200):
        try:
            catalog = Catalog(mirror.reader())
        except TransientError:
            await asyncio.sleep(0.01)
            continue
        if check(catalog):
            return catalog
        await asyncio.sleep(0.01)
    raise AssertionError("the mirror never showed it")


def test_a_mirror_reads_and_writes_what_the_leader_applies() -> None:
    async def run() -> None:
        log = MemoryLog(4)
        clock = FakeClock()
        node = Node(log, MemoryLog(4), [MemoryKV() for _ in range(4)], clock=clock)
        await node.start()
        leader = Registry()
        leader.bind(node)
        definition = TypeDefinition(task_type="charge", queue="payments")
        await leader.register("t", "shop", ["charge"], "v1", definitions=[definition])
        p = registry_partition("t", 4)
        mirror = Mirror(log, p, clock)

        def has_charge(c: Catalog) -> bool:
            return c.definition("t", "shop", "charge") is not None

        catalog = await _until(has_charge, mirror)
        doc = catalog.definition("t", "shop", "charge")
        assert doc is not None and doc["queue"] == "payments"
        # A write from the mirror's side: appended to the log, applied by both.
        record = RegisterTypes(
            tenant="t", app="billing", version="v1", types=[TypeDefinition(task_type="invoice")]
        )
        (reply,) = await mirror.submit(record, "registry/t")
        assert reply.ok
        assert Catalog(mirror.reader()).app("t", "billing") is not None
        await node.processors[p].wait_applied(log.end_offset(p) - 1)
        assert leader.task_types("t", "billing") == frozenset({"invoice"})
        await mirror.close()
        await node.stop()

    asyncio.run(run())
