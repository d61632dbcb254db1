"""Known task types per (tenant, app), fed by ``/worker/register``, kept in ``registry.json``.

Rule 1 (rolling deploys): registration adds types. An agent of a version seen before (an old
agent still running while a deploy rolls out) registering fewer types removes nothing.
Rule 2 (a deploy removes handlers): the first registration of a NEW version is the deploy. A
known type it does not serve is removed by that version: enqueues of it are refused, and
tasks of it still queued fail at dispatch (the gateway completes their lease as FATAL
``HandlerRemoved``) instead of waiting forever for an agent that will never come. Only a
later NEW version that serves the type brings it back, not an old agent still rolling out.
The file is rewritten (atomically) only when something changed, so agent restarts cost no
writes.

Rule 3 (resume policies): the workflow types an agent declares ``pinned`` are the default
policy of enqueues of them that do not name one. The newest version's agents decide (an old
agent still rolling out changes nothing); an agent that declares nothing changes nothing.

    {"tenants": {"<tenant>": {"<app>": {"task_types": [...], "version": "...",
                                        "versions": [...], "removed": {"<type>": "<version>"},
                                        "pinned": [...]}}}}
"""

from __future__ import annotations

import difflib
from pathlib import Path

from conveyor.schemas.resume import RESUME_LATEST, RESUME_PINNED
from conveyor.streams.gateway.errors import UnknownTaskType
from conveyor.streams.gateway.files import read_json, write_json_atomic

REGISTRY_FILE = "registry.json"
HINT_TYPES_MAX = 20  # task types an unknown-type error lists


class Registry:
    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._types: dict[tuple[str, str], set[str]] = {}
        self._versions: dict[tuple[str, str], str] = {}  # the newest version
        self._seen: dict[tuple[str, str], set[str]] = {}  # every version registered
        self._removed: dict[tuple[str, str], dict[str, str]] = {}  # type -> removed by version
        self._pinned: dict[tuple[str, str], set[str]] = {}  # rule 3

    @classmethod
    def load(cls, home: str | Path) -> Registry:
        registry = cls(Path(home) / REGISTRY_FILE)
        doc = read_json(registry._path) if registry._path else None
        for tenant, apps in (doc or {}).get("tenants", {}).items():
            for app, entry in apps.items():
                registry._types[(tenant, app)] = set(entry.get("task_types", []))
                if entry.get("version"):
                    registry._versions[(tenant, app)] = entry["version"]
                registry._seen[(tenant, app)] = set(entry.get("versions", []))
                registry._removed[(tenant, app)] = dict(entry.get("removed", {}))
                registry._pinned[(tenant, app)] = set(entry.get("pinned", []))
        return registry

    def register(
        self,
        tenant: str,
        app: str,
        task_types: list[str],
        version: str | None = None,
        pinned: list[str] | None = None,
    ) -> list[str]:
        """Record an agent's types; returns the types this registration removed (rule 2)."""
        key = (tenant, app)
        known = self._types.setdefault(key, set())
        seen = self._seen.setdefault(key, set())
        removed = self._removed.setdefault(key, {})
        pins = self._pinned.setdefault(key, set())
        before = (set(known), set(seen), dict(removed), self._versions.get(key), set(pins))
        served = set(task_types)
        removed_now: list[str] = []
        if version is not None and version not in seen:
            if seen:  # a deploy; the first version of an app removes nothing
                removed_now = sorted(known - served - set(removed))
                removed.update(dict.fromkeys(removed_now, version))
            for task_type in served & set(removed):
                del removed[task_type]  # a deploy serves it again
            seen.add(version)
            self._versions[key] = version
        known.update(served)
        if pinned is not None and (version is None or version == self._versions.get(key)):
            pins.clear()
            pins.update(pinned)
        if (known, seen, removed, self._versions.get(key), pins) != before:
            self._save()
        return removed_now

    def resume_of(self, tenant: str, app: str, task_type: str) -> str:
        """The resume policy of an enqueue of ``task_type`` that names none (rule 3)."""
        return RESUME_PINNED if task_type in self._pinned.get((tenant, app), ()) else RESUME_LATEST

    def task_types(self, tenant: str, app: str) -> frozenset[str]:
        return frozenset(self._types.get((tenant, app), ()))

    def removed_by(self, tenant: str, app: str, task_type: str) -> str | None:
        """The version whose deploy removed ``task_type``, if one did."""
        return self._removed.get((tenant, app), {}).get(task_type)

    def require(self, tenant: str, app: str, task_type: str, field: str) -> None:
        version = self.removed_by(tenant, app, task_type)
        if version is not None:
            raise UnknownTaskType(
                f"{field}: task type {task_type!r} was removed from app {app!r} by its version "
                f"{version!r}; deploy a version that has the handler to enqueue it again",
                field=field,
            )
        known = self._types.get((tenant, app), set())
        if task_type in known:
            return
        raise UnknownTaskType(
            f"{field}: task type {task_type!r} is not registered for app {app!r}; "
            + self._hint(tenant, task_type, known),
            field=field,
        )

    def _hint(self, tenant: str, task_type: str, known: set[str]) -> str:
        """What to do about a type the app does not have (``known`` are those it has): the name
        it may have meant, the tenant's app that has it, or how an app's types get
        registered."""
        if known:
            close = difflib.get_close_matches(task_type, known, n=1)
            meant = f"did you mean {close[0]!r}? " if close else ""
            listed = ", ".join(sorted(known)[:HINT_TYPES_MAX])
            more = " ..." if len(known) > HINT_TYPES_MAX else ""
            return f"{meant}its agents registered: {listed}{more}"
        elsewhere = sorted(
            a for (t, a), types in self._types.items() if t == tenant and task_type in types
        )
        if elsewhere:
            return f"app {elsewhere[0]!r} has it"
        return (
            "start an agent for the app (conveyor agent --app ...) so it registers its task types"
        )

    def _save(self) -> None:
        if self._path is None:
            return
        tenants: dict[str, dict[str, dict[str, object]]] = {}
        for (tenant, app), types in sorted(self._types.items()):
            entry: dict[str, object] = {"task_types": sorted(types)}
            if (tenant, app) in self._versions:
                entry["version"] = self._versions[(tenant, app)]
            if self._seen.get((tenant, app)):
                entry["versions"] = sorted(self._seen[(tenant, app)])
            if self._removed.get((tenant, app)):
                entry["removed"] = dict(sorted(self._removed[(tenant, app)].items()))
            if self._pinned.get((tenant, app)):
                entry["pinned"] = sorted(self._pinned[(tenant, app)])
            tenants.setdefault(tenant, {})[app] = entry
        write_json_atomic(self._path, {"tenants": tenants})
