"""API keys, from ``$home/keys.json``, plus per-tenant settings from its ``tenants`` object
(``tenants.py``). Each key has a role::

    {"keys": {
      "<key>": {"tenant": "acme", "role": "client"},
      "<key>": {"tenant": "acme", "role": "agent", "app": "shop"},
      "<key>": {"tenant": "acme", "role": "agent", "app": "shop", "version": "v3"}}}

Rule 1 (roles): a ``client`` key enqueues and reads for its tenant: everything under ``/v1``
(the dashboard uses the same API). An ``agent`` key speaks only the worker protocol
(``/worker/*``), and only for the app it is bound to, and that version when it names one: it
registers and polls that app, and heartbeats, completes, checkpoints and commits steps only
of that app's tasks. Anything else is a 403 ``forbidden`` saying which key would do. A stolen
agent key can therefore neither read nor enqueue, nor take or finish another app's work.
Rule 2 (legacy): an entry with no ``role`` is a key of both roles for any app, as every key was
before roles existed. Each load of a file with such entries logs one deprecation warning that
names them by their first 6 characters only, never whole.
Rule 3 (strict): a bad entry (an unknown role or field, an agent key without an app, a client
key with one) is a ValueError naming the entry: a key is never silently given more, or less,
than its entry says. A broken file at start stops the node; a broken re-read keeps the keys
last read and logs why.

Keys are looked up by their SHA-256, so the lookup's timing says nothing about a stored key.
The store re-reads the file when it changes (checked at most once a second): adding a key
needs no restart. ``conveyor keys create`` mints keys (``create_key``).

A key is sent as ``Authorization: Bearer <key>``, or as the password of HTTP Basic
(``Basic base64(<any user>:<key>)``), which is how Confluent schema registry clients send
credentials (``streams/registry/routes.py``); the user name is ignored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import secrets
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from conveyor.errors import Forbidden, Unauthorized
from conveyor.frozen import frozen
from conveyor.streams.clock import Clock, SystemClock
from conveyor.streams.gateway.files import read_json, write_json_atomic
from conveyor.streams.gateway.tenants import DEFAULT_SETTINGS, TenantSettings, parse_tenants

log = logging.getLogger("conveyor.gateway")

KEYS_FILE = "keys.json"
DEV_TENANT = "default"
RELOAD_CHECK_MS = 1_000
KEY_PREFIX = "cvk_"
KEY_SHOWN_CHARS = 6  # of a key, the most any message or log line shows
WORKER_PATH_PREFIX = "/worker/"
HOW_TO_MINT = "conveyor keys create"


class Role(StrEnum):
    CLIENT = "client"
    AGENT = "agent"


BOTH_ROLES = frozenset(Role)
_ENTRY_FIELDS = frozenset({"tenant", "role", "app", "version"})


def shown(key: str) -> str:
    """How a key appears in messages and logs: its first characters only."""
    return f"{key[:KEY_SHOWN_CHARS]}..."


@frozen(kw_only=True)
class Grant:
    """What one key may do: its tenant, its roles, and for an agent key its app (and version).
    ``app`` None: any app of the tenant (a legacy key)."""

    tenant: str
    roles: frozenset[Role]
    app: str | None = None
    version: str | None = None

    @property
    def legacy(self) -> bool:
        return self.roles == BOTH_ROLES

    def check_path(self, path: str) -> None:
        """Forbidden unless this key's roles may call ``path`` (rule 1)."""
        needed = Role.AGENT if path.startswith(WORKER_PATH_PREFIX) else Role.CLIENT
        if needed in self.roles:
            return
        if needed is Role.AGENT:
            raise Forbidden(
                f"{path}: a client key cannot call the worker protocol (/worker/*); run the "
                f"agent with an agent key bound to its app (`{HOW_TO_MINT} --tenant "
                f"{self.tenant} --role agent --app <app>`, then set CONVEYOR_API_KEY)"
            )
        raise Forbidden(
            f"{path}: an agent key (of app {self.app!r}) can only call the worker protocol; "
            f"enqueue and read with a client key (`{HOW_TO_MINT} --tenant {self.tenant} "
            "--role client`)"
        )

    def check_app(self, app: str, version: str | None) -> None:
        """Forbidden unless this key may register and poll ``app`` at ``version``."""
        if self.app is not None and app != self.app:
            raise Forbidden(
                f"app: this agent key is bound to app {self.app!r}, not {app!r}; use an agent "
                f"key bound to app {app!r} (`{HOW_TO_MINT} --tenant {self.tenant} --role agent "
                f"--app {app}`) in keys.json",
                field="app",
            )
        if self.version is not None and version != self.version:
            raise Forbidden(
                f"version: this agent key is bound to version {self.version!r} of app "
                f"{self.app!r}, not {version!r}; use a key of that version, or one bound to "
                'the app alone (no "version" in keys.json)',
                field="version",
            )

    def serves(self, app: str) -> bool:
        """Whether this key may report on leases of ``app``'s tasks."""
        return self.app is None or self.app == app

    def to_json(self) -> dict[str, str]:
        """The keys.json entry of this grant (a legacy one keeps having no role)."""
        entry = {"tenant": self.tenant}
        if not self.legacy:
            (role,) = self.roles
            entry["role"] = role.value
        if self.app is not None:
            entry["app"] = self.app
        if self.version is not None:
            entry["version"] = self.version
        return entry


def client_grant(tenant: str) -> Grant:
    return Grant(tenant=tenant, roles=frozenset({Role.CLIENT}))


def agent_grant(tenant: str, app: str, version: str | None = None) -> Grant:
    return Grant(tenant=tenant, roles=frozenset({Role.AGENT}), app=app, version=version)


def legacy_grant(tenant: str) -> Grant:
    return Grant(tenant=tenant, roles=BOTH_ROLES)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def parse_keys(doc: Mapping[str, object]) -> dict[str, Grant]:
    """key -> grant from a keys.json document; ValueError naming the entry that is wrong."""
    keys = doc.get("keys", {})
    if not isinstance(keys, dict):
        raise ValueError('"keys" must be an object')
    return {key: parse_entry(f"keys[{shown(key)}]", entry) for key, entry in keys.items()}


def parse_entry(name: str, entry: object) -> Grant:
    """One entry of ``keys`` (rule 3). ``name`` says which, without the whole key."""
    if not isinstance(entry, dict):
        raise ValueError(f'{name} must be an object with a "tenant" string')
    tenant = entry.get("tenant")
    if not isinstance(tenant, str) or not tenant:
        raise ValueError(f'{name} needs a "tenant" string')
    app, version = _opt_str(name, entry, "app"), _opt_str(name, entry, "version")
    role = entry.get("role")
    if role is None:
        if app is not None or version is not None:
            raise ValueError(f'{name}: "app" and "version" bind an agent key: add "role": "agent"')
        return legacy_grant(tenant)
    unknown = sorted(set(entry) - _ENTRY_FIELDS)
    if unknown:
        raise ValueError(f"{name}: unknown field {unknown[0]!r}; an entry has {_fields()}")
    if role == Role.CLIENT:
        if app is not None or version is not None:
            raise ValueError(
                f'{name}: a client key is not bound to an app; remove "app" and "version", '
                'or make it "role": "agent"'
            )
        return client_grant(tenant)
    if role == Role.AGENT:
        if app is None:
            raise ValueError(f'{name}: an agent key needs an "app" string: the app it serves')
        return agent_grant(tenant, app, version)
    raise ValueError(f'{name}: "role" must be "client" or "agent", got {role!r}')


def _opt_str(name: str, entry: dict[str, Any], field: str) -> str | None:
    value = entry.get(field)
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{name}: {field!r} must be a non-empty string, got {value!r}")
    return value


def _fields() -> str:
    return ", ".join(sorted(_ENTRY_FIELDS))


def _warn_legacy(path: Path, grants: Mapping[str, Grant]) -> None:
    """Rule 2: one warning per load of a file with keys that have no role."""
    legacy = [f"{shown(key)} of {g.tenant!r}" for key, g in grants.items() if g.legacy]
    if not legacy:
        return
    log.warning(
        '%s: %d key(s) have no "role" (%s): each may call both the client API and the worker '
        'protocol for every app of its tenant. This is deprecated: give each entry "role": '
        '"client" (enqueue and read) or "role": "agent" with "app" (the worker protocol '
        "of that app only), or mint new keys with `%s`",
        path,
        len(legacy),
        ", ".join(legacy),
        HOW_TO_MINT,
    )


def _read(path: Path) -> tuple[dict[str, Grant], dict[str, TenantSettings]]:
    doc = read_json(path) or {}
    grants, settings = parse_keys(doc), parse_tenants(doc)
    _warn_legacy(path, grants)
    return grants, settings


class KeyStore:
    def __init__(
        self,
        keys: Mapping[str, Grant | str],
        path: Path | None = None,
        *,
        clock: Clock | None = None,
        settings: Mapping[str, TenantSettings] | None = None,
    ) -> None:
        """``keys``: key -> grant; a bare tenant name is a legacy key of both roles."""
        self._path = path
        self._clock = clock or SystemClock()
        self._grants = _by_digest(keys)
        self._settings = dict(settings or {})
        self._stamp = self._file_stamp()
        self._checked_ms = self._clock.monotonic_ms()

    @classmethod
    def load(cls, home: str | Path, *, clock: Clock | None = None) -> KeyStore:
        path = Path(home) / KEYS_FILE
        grants, settings = _read(path)
        return cls(grants, path, clock=clock, settings=settings)

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
            grants, settings = _read(self._path)
        except ValueError as exc:  # includes JSON errors
            log.warning("%s: keeping the keys last read: %s", self._path, exc)
            return
        self._grants = _by_digest(grants)
        self._settings = settings
        self._stamp = stamp

    def grant(self, key: str) -> Grant | None:
        self._maybe_reload()
        return self._grants.get(_digest(key))

    def tenant(self, key: str) -> str | None:
        grant = self.grant(key)
        return grant.tenant if grant is not None else None

    def settings(self, tenant: str) -> TenantSettings:
        """The tenant's settings (the defaults when keys.json names none)."""
        self._maybe_reload()
        return self._settings.get(tenant, DEFAULT_SETTINGS)


def _by_digest(keys: Mapping[str, Grant | str]) -> dict[bytes, Grant]:
    return {
        _digest(key): legacy_grant(grant) if isinstance(grant, str) else grant
        for key, grant in keys.items()
    }


def authenticate(store: KeyStore, header: str | None) -> Grant:
    """The grant of an ``Authorization: Bearer <key>`` header."""
    if not header:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <api key>'")
    scheme, _, key = header.partition(" ")
    if scheme.lower() == "basic":
        key = _basic_password(key.strip())
    elif scheme.lower() != "bearer":
        key = ""
    if not key.strip():
        raise Unauthorized("malformed Authorization header; send 'Authorization: Bearer <key>'")
    grant = store.grant(key.strip())
    if grant is None:
        raise Unauthorized("unknown API key; check CONVEYOR_API_KEY or the node's keys.json")
    return grant


def _basic_password(token: str) -> str:
    """The password of an HTTP Basic token; empty when it is not one."""
    try:
        text = base64.b64decode(token, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return ""
    return text.partition(":")[2]


def create_key(home: str | Path, grant: Grant) -> str:
    """A new key for ``grant``, added to ``home/keys.json`` (0600, replaced atomically; a file
    that does not parse is left alone: ValueError)."""
    path = Path(home) / KEYS_FILE
    doc = read_json(path) or {"keys": {}}
    parse_keys(doc)
    key = KEY_PREFIX + secrets.token_urlsafe(24)
    doc.setdefault("keys", {})[key] = grant.to_json()
    write_json_atomic(path, doc, mode=0o600)
    return key


def find_key(home: str | Path, wanted: Grant, *, legacy_ok: bool = True) -> str | None:
    """The first key in ``home/keys.json`` that may do what ``wanted`` may, or None. A legacy
    key of the tenant may do anything (``legacy_ok``: count it)."""
    doc = read_json(Path(home) / KEYS_FILE) or {}
    for key, grant in parse_keys(doc).items():
        if grant.tenant != wanted.tenant or not wanted.roles <= grant.roles:
            continue
        if grant.legacy and legacy_ok:
            return key
        if not grant.legacy and (grant.app, grant.version) == (wanted.app, wanted.version):
            return key
    return None


def ensure_dev_key(home: str | Path) -> str:
    """A client key of tenant ``default`` in ``home/keys.json``, created if there is none (a
    legacy key of ``default`` serves: it is the key a home made before roles printed)."""
    return find_key(home, client_grant(DEV_TENANT)) or create_key(home, client_grant(DEV_TENANT))


def ensure_agent_key(home: str | Path, app: str) -> str:
    """An agent key of tenant ``default`` bound to ``app``, created if there is none (never a
    legacy key: the dev agent runs the app's code with a key that can do no more than it must)."""
    wanted = agent_grant(DEV_TENANT, app)
    return find_key(home, wanted, legacy_ok=False) or create_key(home, wanted)
