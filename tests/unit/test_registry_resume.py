"""The registry's rule 3: the resume policy an enqueue gets when it names none is the one the
newest version's agents declared for the type, kept across a restart of the gateway."""

from __future__ import annotations

from pathlib import Path

from conveyor.streams.gateway.registry import Registry


def test_the_newest_versions_agents_decide_and_it_survives_a_restart(tmp_path: Path) -> None:
    registry = Registry.load(tmp_path)
    types = ["checkout", "email"]
    registry.register("t", "shop", types, "v1", pinned=["checkout"])
    assert registry.resume_of("t", "shop", "checkout") == "pinned"
    assert registry.resume_of("t", "shop", "email") == "latest"
    assert registry.resume_of("t", "other", "checkout") == "latest"
    registry.register("t", "shop", types, "v2", pinned=[])  # the deploy of v2 unpins it
    registry.register("t", "shop", types, "v1", pinned=["checkout"])  # an old agent: no say
    registry.register("t", "shop", types, "v2")  # an agent that declares nothing: no change
    assert registry.resume_of("t", "shop", "checkout") == "latest"
    registry.register("t", "shop", types, "v3", pinned=["email"])
    assert Registry.load(tmp_path).resume_of("t", "shop", "email") == "pinned"
