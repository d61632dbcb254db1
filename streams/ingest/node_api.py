"""What the router asks of a node, over its HTTP API with one tenant's client key: the
tenant's schema registry (``/registry``) and the batch enqueue (``POST /v1/tasks:batch``).

The router enqueues as every client does, so the task type's defaults (queue, priority,
retry, timeouts), the payload's check against the type's schema, the tenant's quotas and a
cluster's forwarding to the partition's owner all apply as on every other enqueue path.

Answers sort into three: done, refused (the record's fault: it is quarantined), or not now
(the node or the network: retried until it answers, never quarantined). A key the node
refuses (401, 403) is the router's configuration, not a record's fault: ``KeyRefused``
stops the router, whose command exits naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

RETRY_MS_DEFAULT = 500  # a 5xx or an unreachable node without retry_after_ms
RETRY_MS_MAX = 10_000
REQUEST_TIMEOUT_S = 60.0
_ITEM = re.compile(r"^tasks\[([0-9]+)\]")
_SECONDS = re.compile(r"[0-9]{1,6}(\.[0-9]{1,3})?")


def subject_of(app: str, task_type: str) -> str:
    """The subject of a task type's payload schema, as ``registry/routes.py`` names it (that
    module imports the gateway, which the router does not load)."""
    return f"{app}.{task_type}-value"


class KeyRefused(Exception):
    """The node refused the router's key (401/403): the message says which key to use."""


class NotNow(Exception):
    """The node did not answer for now (unreachable, 5xx, 429); try again after
    ``retry_after_ms``."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


@dataclass(frozen=True, slots=True)
class Subject:
    """A subject's versions: their schema ids, and the text of the newest (the reader's)."""

    ids: frozenset[int]
    latest: str


class NodeApi:
    def __init__(self, url: str, key: str) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {key}"}
        self._session: aiohttp.ClientSession | None = None
        self._schemas: dict[int, str | None] = {}  # by id; None: the registry has no such id
        self._subjects: dict[str, Subject | None] = {}

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        self._session = aiohttp.ClientSession(timeout=timeout, headers=self._headers)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def check_key(self) -> None:
        """KeyRefused now if the node refuses the key, rather than at the first record."""
        await self._call("GET", "/registry/subjects")

    # -- the registry -------------------------------------------------------------------------

    async def schema(self, schema_id: int) -> str | None:
        """The text of schema ``schema_id`` of the tenant's registry; None if it has none.
        Ids are never reused for another schema, so an answer is kept."""
        if schema_id not in self._schemas:
            status, body = await self._call("GET", f"/registry/schemas/ids/{schema_id}")
            self._schemas[schema_id] = str(body["schema"]) if status == 200 else None
        return self._schemas[schema_id]

    async def subject(self, app: str, task_type: str, *, fresh: bool = False) -> Subject | None:
        """The versions of the task type's payload subject (``<app>.<task_type>-value``);
        None if it has none. ``fresh``: ask again (a version registered since)."""
        name = subject_of(app, task_type)
        if fresh or name not in self._subjects:
            self._subjects[name] = await self._read_subject(name)
        return self._subjects[name]

    async def _read_subject(self, name: str) -> Subject | None:
        quoted = quote(name, safe="")
        status, versions = await self._call("GET", f"/registry/subjects/{quoted}/versions")
        if status != 200 or not versions:
            return None
        ids: set[int] = set()
        latest = ""
        for version in sorted(int(v) for v in versions):
            status, row = await self._call("GET", f"/registry/subjects/{quoted}/versions/{version}")
            if status == 200:
                ids.add(int(row["id"]))
                self._schemas[int(row["id"])] = latest = str(row["schema"])
        return Subject(frozenset(ids), latest) if ids else None

    # -- the enqueue ----------------------------------------------------------------------------

    async def enqueue(self, items: list[dict[str, Any]]) -> dict[int, str]:
        """Enqueue ``items`` (the ``tasks`` of a batch); the refused ones by index, with the
        node's reason. An item refused is left out and the others are sent again until the
        node takes them: keyed, a resent item meets its twin."""
        refused: dict[int, str] = {}
        left = list(range(len(items)))
        while left:
            status, body = await self._call(
                "POST", "/v1/tasks:batch", {"tasks": [items[i] for i in left]}
            )
            if status in (200, 201):
                return refused
            error = body.get("error", {}) if isinstance(body, dict) else {}
            match = _ITEM.match(str(error.get("field") or ""))
            reason = f"{status} {error.get('code', 'refused')}: {error.get('message', body)}"
            if match is not None and int(match.group(1)) < len(left):
                refused[left.pop(int(match.group(1)))] = reason
            elif len(left) == 1:  # refused whole (413 and the like): it is this one item's
                refused[left.pop()] = reason
            else:  # refused whole without naming an item: send them one by one
                for i in left:
                    for reason in (await self.enqueue([items[i]])).values():
                        refused[i] = reason
                return refused
        return refused

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, JSON body) of a 2xx or a 4xx the caller reads; KeyRefused for 401/403;
        NotNow for a 429, a 5xx or no answer."""
        assert self._session is not None, "NodeApi.start() first"
        try:
            async with self._session.request(method, self.url + path, json=body) as reply:
                text = await reply.text()
                status = reply.status
                retry_after = reply.headers.get("Retry-After", "")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise NotNow(
                f"the node at {self.url} did not answer: {exc!r}", RETRY_MS_DEFAULT
            ) from None
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = None
        if status in (401, 403):
            message = _message(parsed) or text[:200]
            raise KeyRefused(
                f"the node at {self.url} refused the router's key ({status}): {message}"
            )
        if status == 429 or status >= 500:
            raise NotNow(f"the node answered {status}: {_message(parsed)}", _retry_ms(retry_after))
        return status, parsed


def _message(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("message", ""))
        return str(body.get("message", ""))
    return ""


def _retry_ms(retry_after: str) -> int:
    """A ``Retry-After`` of seconds, in ms and at most ``RETRY_MS_MAX``."""
    seconds = float(retry_after) if _SECONDS.fullmatch(retry_after) else 0.0
    wait = int(seconds * 1000) if seconds > 0 else RETRY_MS_DEFAULT
    return min(wait, RETRY_MS_MAX)
