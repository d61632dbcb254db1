"""The registry's rule 3: the resume policy an enqueue gets when it names none is the one the
newest version's agents declared for the type, kept across a restart of the node (the rows
are records in its log). And what an enqueue of a type the app does not have is told."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from conveyor.streams.gateway.errors import UnknownTaskType
from conveyor.streams.gateway.registry import Registry
from conveyor.streams.node import Node


class Sync:
    """A registry whose ``register`` is called like a function (it applies in memory)."""

    def __init__(self) -> None:
        self.registry = Registry()

    def register(self, *args: Any, **kwargs: Any) -> list[str]:
        return asyncio.run(self.registry.register(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.registry, name)


def test_the_newest_versions_agents_decide_and_it_survives_a_restart(tmp_path: Path) -> None:
    async def run() -> None:
        node = await Node.open(tmp_path, partitions=2)
        await node.start()
        registry = Registry()
        registry.bind(node)
        types = ["checkout", "email"]
        await registry.register("t", "shop", types, "v1", pinned=["checkout"])
        assert registry.resume_of("t", "shop", "checkout") == "pinned"
        assert registry.resume_of("t", "shop", "email") == "latest"
        assert registry.resume_of("t", "other", "checkout") == "latest"
        await registry.register("t", "shop", types, "v2", pinned=[])  # v2's deploy unpins it
        await registry.register("t", "shop", types, "v1", pinned=["checkout"])  # old: no say
        await registry.register("t", "shop", types, "v2")  # declares nothing: no change
        assert registry.resume_of("t", "shop", "checkout") == "latest"
        await registry.register("t", "shop", types, "v3", pinned=["email"])
        await node.stop()
        node = await Node.open(tmp_path)
        await node.start()
        again = Registry()
        again.bind(node)
        assert again.resume_of("t", "shop", "email") == "pinned"
        assert again.resume_of("t", "shop", "checkout") == "latest"
        await node.stop()

    asyncio.run(run())


def test_an_unknown_task_type_is_answered_with_what_to_do_instead() -> None:
    registry = Sync()
    registry.register("t", "shop", ["charge_card", "send_receipt"], "v1")
    registry.register("t", "billing", ["invoice"], "v1")
    registry.register("u", "ledger", ["post"], "v1")

    def refusal(app: str, task_type: str) -> str:
        with pytest.raises(UnknownTaskType) as caught:
            registry.require("t", app, task_type, "task_type")
        return str(caught.value)

    registry.require("t", "shop", "charge_card", "task_type")  # known: no error
    assert refusal("shop", "charge_crad").endswith(
        "did you mean 'charge_card'? its agents registered: charge_card, send_receipt"
    )
    assert refusal("shop", "zzz").endswith("its agents registered: charge_card, send_receipt")
    assert refusal("orders", "invoice").endswith("app 'billing' has it")
    # Another tenant's apps are not named; an app with no types says how they get registered.
    assert refusal("orders", "post").endswith("so it registers its task types")


def test_deploy_order_is_the_declared_number_not_the_order_of_arrival() -> None:
    registry = Sync()
    registry.register("t", "shop", ["a", "b"], "v1", deploy=1)
    # The new deploy registers first, then an agent of the old one (restarted, or slow to
    # stop): nothing of the new is removed, though the old version is the newer arrival.
    assert registry.register("t", "shop", ["a", "b", "c"], "v2", deploy=2) == []
    assert registry.register("t", "shop", ["a", "b"], "v1", deploy=1) == []
    assert registry.register("t", "shop", ["a"], "v0") == []  # no number: adds only
    for task_type in ("a", "b", "c"):
        registry.require("t", "shop", task_type, "task_type")
    # Only a higher deploy number than any before removes what it does not serve.
    assert registry.register("t", "shop", ["a", "c"], "v3", deploy=3) == ["b"]
    assert registry.removed_by("t", "shop", "b") == "v3"
    assert registry.register("t", "shop", ["a", "b", "c"], "v2", deploy=2) == []
    assert registry.removed_by("t", "shop", "b") == "v3"  # an older deploy brings none back


def test_a_registry_json_of_an_older_version_answers_until_the_app_registers(
    tmp_path: Path,
) -> None:
    legacy = {"task_types": ["a", "b"], "version": "v1", "deploy": 4, "pinned": ["b"]}
    (tmp_path / "registry.json").write_text(json.dumps({"tenants": {"t": {"shop": legacy}}}))

    async def run() -> None:
        node = await Node.open(tmp_path, partitions=2)
        await node.start()
        registry = Registry.load(tmp_path)
        registry.bind(node)
        registry.require("t", "shop", "a", "task_type")  # from the file
        assert registry.resume_of("t", "shop", "b") == "pinned"
        # The app's first registration writes the file's row first: deploy 4 is known, so
        # deploy 5 serving only "a" removes "b".
        assert await registry.register("t", "shop", ["a"], "v2", deploy=5) == ["b"]
        await node.stop()
        node = await Node.open(tmp_path)
        await node.start()
        again = Registry()  # the log alone
        again.bind(node)
        assert again.task_types("t", "shop") == frozenset({"a", "b"})
        assert again.removed_by("t", "shop", "b") == "v2"
        await node.stop()

    asyncio.run(run())
