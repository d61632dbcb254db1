"""What each side of the package imports, transitively, in a fresh interpreter.

``pip install conveyor`` is the SDK, both clients, the agent and the client commands; the node
is the server extra (``conveyor.extras``). So ``import conveyor`` and everything a web app or a
worker uses (``Client``, ``AsyncClient``, ``App``, the host agent, the client commands) must
load no module of the node (``conveyor.streams``, ``conveyor.store``) and no package of the
server, s3 or kafka extras: in a slim install those are absent, and the import would fail.
The other way round, the node's pure state machine (``conveyor.streams.machine``) shares only
the light leaf modules of the package (errors, frozen dataclasses, durations, the schemas) and
loads nothing of the SDK's client, App or task-context side, nor the HTTP contract's models
(``conveyor.contract``: the gateway's, not the machine's).

test_layering.py reads each file's own import lines; this test runs the imports and reads
``sys.modules``, so an import three modules away, or an eager package ``__init__``, counts.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conveyor.extras import MODULES

EXTRAS_PACKAGES = frozenset(name for names in MODULES.values() for name in names)
NODE = ("conveyor.streams", "conveyor.store")
# The modules the state machine may load from the package: the shared base, the schemas, the
# store's tables and keys, and itself.
MACHINE_SHARED = frozenset({"conveyor", "conveyor.errors", "conveyor.frozen", "conveyor.durations"})
MACHINE_PREFIXES = ("conveyor.schemas", "conveyor.store", "conveyor.streams")
HTTP_CLIENTS = frozenset({"httpx", "aiohttp"})


def loaded(code: str) -> set[str]:
    """The modules in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


def top_levels(modules: set[str]) -> set[str]:
    return {m.partition(".")[0] for m in modules}


def node_side(modules: set[str]) -> list[str]:
    """The modules of ``modules`` that belong to the node or to an extra's packages."""
    return sorted(
        m for m in modules if m.startswith(NODE) or m.partition(".")[0] in EXTRAS_PACKAGES
    )


def test_import_conveyor_loads_only_the_package() -> None:
    found = {m for m in loaded("import conveyor") if m.startswith("conveyor")}
    assert found == {"conveyor"}


@pytest.mark.parametrize(
    "code",
    [
        "import conveyor; conveyor.Client; conveyor.App; conveyor.Retry; conveyor.Context",
        # an app with a task, a client built and a call prepared: what a web app does
        "import conveyor\n"
        "app = conveyor.App('shop')\n"
        "@app.task(retry=conveyor.Retry(attempts=3), timeout='10m')\n"
        "def resize(ctx, payload): ...\n"
        "conveyor.Client('http://127.0.0.1:1', 'k')",
        "import conveyor; conveyor.AsyncClient('http://127.0.0.1:1', 'k')",
        "import conveyor.workflows, conveyor.codecs, conveyor.typed, conveyor.avro_schema",
        # the reply models, the field types and the limits: the SDK decodes replies with them
        "import conveyor.contract.replies, conveyor.contract.shapes, conveyor.contract.limits",
        "import conveyor.agents.host, conveyor.agents.guest",  # conveyor agent and its guests
        "import conveyor.cli",  # the client commands; node and dev check their extra when run
        "from conveyor import *",  # every exported name (conveyor.testing is not one)
    ],
    ids=[
        "names",
        "app-and-client",
        "async-client",
        "sdk-modules",
        "contract",
        "agent",
        "cli",
        "star",
    ],
)
def test_the_sdk_side_loads_nothing_of_the_node(code: str) -> None:
    assert node_side(loaded(code)) == []


def test_the_async_client_loads_aiohttp_only_when_it_sends() -> None:
    found = loaded("import conveyor; conveyor.AsyncClient('http://127.0.0.1:1', 'k')")
    assert "aiohttp" not in top_levels(found)


def test_the_state_machine_loads_only_the_shared_base_of_the_sdk() -> None:
    found = loaded("import conveyor.streams.machine")
    sdk_side = sorted(
        m
        for m in found
        if m.startswith("conveyor")
        and m not in MACHINE_SHARED
        and not m.startswith(MACHINE_PREFIXES)
    )
    assert sdk_side == [], "the state machine loads the SDK's side"
    assert top_levels(found) & HTTP_CLIENTS == set()


def test_the_extras_modules_are_the_ones_pyproject_installs() -> None:
    """``conveyor.extras.MODULES`` names what the server, s3 and kafka extras install, to say
    which extra a missing module needs; it must match pyproject.toml's lists (read here), each
    distribution mapped to its top-level modules by the installed metadata."""
    import importlib.metadata
    import re
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    by_dist: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            by_dist.setdefault(re.sub(r"[-_.]+", "-", dist).lower(), set()).add(module)
    for extra, names in MODULES.items():
        dists = [re.split(r"[\[<>=!~ ;]", spec, maxsplit=1)[0].lower() for spec in extras[extra]]
        # what the extra installs: its distributions and the ones they require (botocore)
        required = [
            re.split(r"[\[<>=!~ ;(]", spec, maxsplit=1)[0].lower()
            for d in dists
            for spec in importlib.metadata.requires(d) or []
            if "extra ==" not in spec
        ]
        installed = set().union(*(by_dist.get(d, set()) for d in dists + required))
        # every listed module comes from the extra, and every distribution has one listed
        assert set(names) <= installed, (extra, set(names) - installed)
        for dist in dists:
            assert by_dist[dist] & set(names), f"{extra}: no module of {dist} in MODULES"
