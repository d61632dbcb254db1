"""API keys -> tenants, from ``$home/keys.json``: ``{"keys": {"<key>": {"tenant": "<t>"}}}``,
plus per-tenant settings from its ``tenants`` object (``tenants.py``).

Keys are looked up by their SHA-256, so the lookup's timing says nothing about a stored key.
The store re-reads the file when it changes (checked at most once a second): adding a key
needs no restart. A broken file keeps the keys last read and logs why.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Mapping
from pathlib import Path

from conveyor.errors import Unauthorized
from conveyor.streams.clock import Clock, SystemClock
from conveyor.streams.gateway.files import read_json, write_json_atomic
from conveyor.streams.gateway.tenants import DEFAULT_SETTINGS, TenantSettings, parse_tenants

log = logging.getLogger("conveyor.gateway")

KEYS_FILE = "keys.json"
DEV_TENANT = "default"
RELOAD_CHECK_MS = 1_000
KEY_PREFIX = "cvk_"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def parse_keys(doc: Mapping[str, object]) -> dict[str, str]:
    """key -> tenant from a keys.json document; ValueError naming what is wrong."""
    keys = doc.get("keys", {})
    if not isinstance(keys, dict):
        raise ValueError('"keys" must be an object')
    out: dict[str, str] = {}
    for key, entry in keys.items():
        tenant = entry.get("tenant") if isinstance(entry, dict) else None
        if not isinstance(tenant, str) or not tenant:
            raise ValueError(f'keys[{key[:6]}...] needs a "tenant" string')
        out[key] = tenant
    return out


class KeyStore:
    def __init__(
        self,
        keys: Mapping[str, str],
        path: Path | None = None,
        *,
        clock: Clock | None = None,
        settings: Mapping[str, TenantSettings] | None = None,
    ) -> None:
        self._path = path
        self._clock = clock or SystemClock()
        self._tenants = {_digest(k): t for k, t in keys.items()}
        self._settings = dict(settings or {})
        self._stamp = self._file_stamp()
        self._checked_ms = self._clock.monotonic_ms()

    @classmethod
    def load(cls, home: str | Path, *, clock: Clock | None = None) -> KeyStore:
        path = Path(home) / KEYS_FILE
        doc = read_json(path) or {}
        return cls(parse_keys(doc), path, clock=clock, settings=parse_tenants(doc))

    def _file_stamp(self) -> tuple[int, int] | None:
        if self._path is None:
            return None
        try:
            st = self._path.stat()
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size

    def _maybe_reload(self) -> None:
        now = self._clock.monotonic_ms()
        if self._path is None or now - self._checked_ms < RELOAD_CHECK_MS:
            return
        self._checked_ms = now
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        try:
            doc = read_json(self._path) or {}
            keys, settings = parse_keys(doc), parse_tenants(doc)
        except ValueError as exc:  # includes JSON errors
            log.warning("%s: keeping the keys last read: %s", self._path, exc)
            return
        self._tenants = {_digest(k): t for k, t in keys.items()}
        self._settings = settings
        self._stamp = stamp

    def tenant(self, key: str) -> str | None:
        self._maybe_reload()
        return self._tenants.get(_digest(key))

    def settings(self, tenant: str) -> TenantSettings:
        """The tenant's settings (the defaults when keys.json names none)."""
        self._maybe_reload()
        return self._settings.get(tenant, DEFAULT_SETTINGS)


def authenticate(store: KeyStore, header: str | None) -> str:
    """The tenant of an ``Authorization: Bearer <key>`` header."""
    if not header:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <api key>'")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("malformed Authorization header; send 'Authorization: Bearer <key>'")
    tenant = store.tenant(key.strip())
    if tenant is None:
        raise Unauthorized("unknown API key; check CONVEYOR_API_KEY or the node's keys.json")
    return tenant


def ensure_dev_key(home: str | Path) -> str:
    """The key of tenant ``default`` in ``home/keys.json``, created (0600) if there is none."""
    path = Path(home) / KEYS_FILE
    doc = read_json(path) or {"keys": {}}
    for key, tenant in parse_keys(doc).items():
        if tenant == DEV_TENANT:
            return key
    key = KEY_PREFIX + secrets.token_urlsafe(24)
    doc.setdefault("keys", {})[key] = {"tenant": DEV_TENANT}
    write_json_atomic(path, doc, mode=0o600)
    return key
