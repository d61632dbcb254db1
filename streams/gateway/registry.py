"""Known task types per (tenant, app), fed by ``/worker/register``, kept in ``registry.json``.

Registration only ever adds: an agent of an older version registering fewer types does not
make tasks of the newer types unenqueueable while a rolling deploy is in progress. The file is
rewritten (atomically) only when something changed, so agent restarts cost no writes.

    {"tenants": {"<tenant>": {"<app>": {"task_types": [...], "version": "..."}}}}
"""

from __future__ import annotations

from pathlib import Path

from conveyor.streams.gateway.errors import UnknownTaskType
from conveyor.streams.gateway.files import read_json, write_json_atomic

REGISTRY_FILE = "registry.json"


class Registry:
    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._types: dict[tuple[str, str], set[str]] = {}
        self._versions: dict[tuple[str, str], str] = {}

    @classmethod
    def load(cls, home: str | Path) -> Registry:
        registry = cls(Path(home) / REGISTRY_FILE)
        doc = read_json(registry._path) if registry._path else None
        for tenant, apps in (doc or {}).get("tenants", {}).items():
            for app, entry in apps.items():
                registry._types[(tenant, app)] = set(entry.get("task_types", []))
                if entry.get("version"):
                    registry._versions[(tenant, app)] = entry["version"]
        return registry

    def register(
        self, tenant: str, app: str, task_types: list[str], version: str | None = None
    ) -> None:
        known = self._types.setdefault((tenant, app), set())
        changed = not known.issuperset(task_types)
        known.update(task_types)
        if version is not None and self._versions.get((tenant, app)) != version:
            self._versions[(tenant, app)] = version
            changed = True
        if changed:
            self._save()

    def task_types(self, tenant: str, app: str) -> frozenset[str]:
        return frozenset(self._types.get((tenant, app), ()))

    def require(self, tenant: str, app: str, task_type: str, field: str) -> None:
        if task_type in self._types.get((tenant, app), ()):
            return
        raise UnknownTaskType(
            f"{field}: task type {task_type!r} is not registered for app {app!r}; start an "
            f"agent for the app (conveyor agent --app ...) so it registers its task types",
            field=field,
        )

    def _save(self) -> None:
        if self._path is None:
            return
        tenants: dict[str, dict[str, dict[str, object]]] = {}
        for (tenant, app), types in sorted(self._types.items()):
            entry: dict[str, object] = {"task_types": sorted(types)}
            if (tenant, app) in self._versions:
                entry["version"] = self._versions[(tenant, app)]
            tenants.setdefault(tenant, {})[app] = entry
        write_json_atomic(self._path, {"tenants": tenants})
