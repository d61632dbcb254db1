"""Known task types per (tenant, app), fed by ``/worker/register``, kept in ``registry.json``.

Rule 1 (rolling deploys): registration adds types. An agent registering fewer types than are
known removes nothing unless rule 2 says so.
Rule 2 (a deploy removes handlers): deploy order is declared, never inferred from arrival. An
agent declares its deploy number (``conveyor agent --deploy N``, ``$CONVEYOR_DEPLOY``): one
number per rollout, higher for each newer one (a CI build number, a release counter). Only a
registration whose deploy number is higher than the newest known is the deploy: a known type
it does not serve is removed by it, and enqueues of it are refused (the first deploy number
an app sees removes nothing: there is nothing older to compare it with). An agent of an older or
the same deploy, or one that declares none, removes nothing, whatever the order in which the
agents of a rollout start: an old agent restarting after the new version registered leaves
the new version's types alone. (Versions are names, and the first agent of a version to
register may be the old one, so neither names nor arrival can say which is newer.) Tasks of a
removed type already queued stay ENQUEUED: polls name the types their agents serve
(``processor/pool.py``), so such a task is dealt to an agent still running an older deploy
that has its handler, or to none; its details say so (``unserved``). Only a later deploy that
serves the type again brings it back. The file is rewritten (atomically) only when something
changed, so agent restarts cost no writes.

Rule 3 (resume policies): the workflow types an agent declares ``pinned`` are the default
policy of enqueues of them that do not name one. The newest deploy's agents decide (an agent of
an older deploy changes nothing; without deploy numbers, the agents of the newest version
registered); an agent that declares nothing changes nothing.

    {"tenants": {"<tenant>": {"<app>": {"task_types": [...], "version": "...", "deploy": N,
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
        self._deploys: dict[tuple[str, str], int] = {}  # the newest deploy number (rule 2)

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
                if isinstance(entry.get("deploy"), int):
                    registry._deploys[(tenant, app)] = entry["deploy"]
        return registry

    def register(
        self,
        tenant: str,
        app: str,
        task_types: list[str],
        version: str | None = None,
        pinned: list[str] | None = None,
        *,
        deploy: int | None = None,
    ) -> list[str]:
        """Record an agent's types; returns the types this registration removed (rule 2)."""
        key = (tenant, app)
        known = self._types.setdefault(key, set())
        seen = self._seen.setdefault(key, set())
        removed = self._removed.setdefault(key, {})
        pins = self._pinned.setdefault(key, set())
        before = (set(known), set(seen), dict(removed), self._state(key), set(pins))
        served = set(task_types)
        newest = self._deploys.get(key)
        current = self._is_current(key, version, deploy)
        removed_now: list[str] = []
        if deploy is not None and newest is not None and deploy > newest:
            removed_now = sorted(known - served - set(removed))  # a deploy (rule 2)
            removed.update(dict.fromkeys(removed_now, version or f"deploy {deploy}"))
        if deploy is not None and (newest is None or deploy > newest):
            self._deploys[key] = deploy
        if current:
            for task_type in served & set(removed):
                del removed[task_type]  # the newest deploy serves it again
            if version is not None:
                self._versions[key] = version
        if version is not None:
            seen.add(version)
        known.update(served)
        if pinned is not None and current:
            pins.clear()
            pins.update(pinned)
        if (known, seen, removed, self._state(key), pins) != before:
            self._save()
        return removed_now

    def _is_current(self, key: tuple[str, str], version: str | None, deploy: int | None) -> bool:
        """Whether a registration speaks for the newest deploy (rules 2 and 3): its deploy
        number is the newest or newer; without any deploy number known, it is of the newest
        version registered or of a version not seen before."""
        newest = self._deploys.get(key)
        if newest is not None:
            return deploy is not None and deploy >= newest
        if deploy is not None:
            return True
        return (
            version is None
            or version == self._versions.get(key)
            or (version not in self._seen.get(key, set()))
        )

    def _state(self, key: tuple[str, str]) -> tuple[str | None, int | None]:
        return self._versions.get(key), self._deploys.get(key)

    def resume_of(self, tenant: str, app: str, task_type: str) -> str:
        """The resume policy of an enqueue of ``task_type`` that names none (rule 3)."""
        return RESUME_PINNED if task_type in self._pinned.get((tenant, app), ()) else RESUME_LATEST

    def task_types(self, tenant: str, app: str) -> frozenset[str]:
        return frozenset(self._types.get((tenant, app), ()))

    def removed_by(self, tenant: str, app: str, task_type: str) -> str | None:
        """The version whose deploy removed ``task_type``, if one did."""
        return self._removed.get((tenant, app), {}).get(task_type)

    def unserved(self, tenant: str, app: str, task_type: str) -> str | None:
        """What a queued task of a removed type waits for (rule 2), or None."""
        version = self.removed_by(tenant, app, task_type)
        if version is None:
            return None
        return (
            f"an agent serving task type {task_type!r}: version {version!r} of app {app!r} "
            "removed its handler, so only an agent of an older deploy still running takes it; "
            "deploy a version with the handler, or cancel the task"
        )

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
            if (tenant, app) in self._deploys:
                entry["deploy"] = self._deploys[(tenant, app)]
            if self._seen.get((tenant, app)):
                entry["versions"] = sorted(self._seen[(tenant, app)])
            if self._removed.get((tenant, app)):
                entry["removed"] = dict(sorted(self._removed[(tenant, app)].items()))
            if self._pinned.get((tenant, app)):
                entry["pinned"] = sorted(self._pinned[(tenant, app)])
            tenants.setdefault(tenant, {})[app] = entry
        write_json_atomic(self._path, {"tenants": tenants})
