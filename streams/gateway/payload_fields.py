"""Searchable payload fields: what of a payload the query snapshot can find a task by.

At enqueue the gateway copies the top-level scalar fields of a payload that is a JSON object
(string, number, true/false, null) into the spec's ``payload_fields``, as compact JSON; the
TaskEnqueued carries them to the projector, which keeps them in the snapshot's
``tasks.payload_fields`` (jsonb, GIN-indexed). ``GET /v1/tasks?payload.<field>=<value>``
then lists the tasks whose fields contain every pair asked for.

Rules, and why:
1. Only what the tenant could read anyway: nothing of a payload the tenant hides
   (``show_payloads: false``), of one stored as a blob (past the inline limit), or of an
   encoded one (a codec's envelope, ``schemas/envelope.py``: the node cannot read it).
2. Cheap on the enqueue path: the payload is already parsed; a payload that is not an object
   costs one type check; nested values (objects, arrays) are skipped, never walked.
3. Bounded: at most ``FIELDS_MAX`` fields and ``FIELDS_BYTES_MAX`` bytes of JSON in all, taken
   in the payload's order; a field that would pass the bytes bound is skipped (a long text
   is no search key) and the following ones still count. A field whose name is not a name
   (``schemas/limits.py``: letters, digits, ``_ . : -``) is skipped: a search could not name it.
   So is a string holding U+0000, which the snapshot's jsonb cannot store.
4. A searched value is a JSON scalar: text that parses as a JSON number, true, false or null
   is that (``payload.n=3`` finds ``{"n": 3}``, not ``{"n": "3"}``); any other text is a string.
   To find the string ``"3"`` send it quoted, as JSON: ``payload.n="3"``. ``payload[n]=3`` is
   the same search (OpenAPI's deepObject style, as the document describes the parameter).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from conveyor.schemas import limits
from conveyor.schemas.envelope import ENVELOPE_KEY
from conveyor.streams.gateway.fields import invalid

FIELDS_MAX = 16
FIELDS_BYTES_MAX = 2048  # of the fields' compact JSON
# Every query key that starts so is a search's: ``payload.<field>``, or ``payload[<field>]``
# (the same, as OpenAPI's deepObject style writes a map); any other such key is refused.
SEARCH_PREFIX = "payload"
_SEARCH_KEY = re.compile(r"payload(?:\.(.*)|\[(.*)\])", re.DOTALL)
SEARCH_FIELDS_MAX = FIELDS_MAX  # pairs in one search: a task has no more fields than this
SEARCH_VALUE_BYTES_MAX = FIELDS_BYTES_MAX

_SCALARS = (str, int, float, bool, type(None))
_SCALAR_TYPES = frozenset(_SCALARS)  # exact types: what a JSON parser makes
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_NAMES_KEPT_MAX = 4096
_names: dict[str, bool] = {}  # field name -> is a name: payloads of a type repeat their names


def extract(payload: Any) -> str | None:
    """The searchable fields of a parsed payload as compact JSON; None when it has none
    (rules 2 and 3). The caller applies rule 1. The first ``FIELDS_MAX`` fields are encoded
    at once; only when they pass the bytes bound are they taken one at a time."""
    if type(payload) is not dict or ENVELOPE_KEY in payload:
        return None
    kept: dict[str, Any] = {}
    for name, value in payload.items():
        if _searchable(name, value):
            kept[name] = value
            if len(kept) == FIELDS_MAX:
                break
    if not kept:
        return None
    text = _dumps(kept)
    if len(text) * 4 <= FIELDS_BYTES_MAX or len(text.encode()) <= FIELDS_BYTES_MAX:
        return text
    return _bounded(payload)


def _searchable(name: str, value: Any) -> bool:
    kind = type(value)
    if kind not in _SCALAR_TYPES:
        return False
    if kind is str and "\x00" in value:
        return False  # jsonb cannot hold U+0000
    if kind is float and not math.isfinite(value):
        return False  # not JSON
    known = _names.get(name)
    if known is None:
        if len(_names) >= _NAMES_KEPT_MAX:
            _names.clear()
        known = _names[name] = limits.is_name(name)
    return known


def _bounded(payload: dict[str, Any]) -> str | None:
    """Rule 3 field by field: a field that would pass the bytes bound is skipped."""
    parts: list[str] = []
    size = 1  # the braces, less the comma the first field does not need
    for name, value in payload.items():
        if not _searchable(name, value):
            continue
        part = f"{_dumps(name)}:{_dumps(value)}"
        cost = len(part.encode()) + 1
        if size + cost > FIELDS_BYTES_MAX:
            continue
        parts.append(part)
        size += cost
        if len(parts) == FIELDS_MAX:
            break
    return "{" + ",".join(parts) + "}" if parts else None


def parse_search(pairs: Iterable[tuple[str, str]]) -> str | None:
    """The ``payload.<field>=<value>`` pairs of a listing's query string as the JSON object a
    task's fields must contain (rule 4); None when there are none. A field named twice with
    two values matches nothing, so it is refused."""
    wanted: dict[str, Any] = {}
    for key, text in pairs:
        if not key.startswith(SEARCH_PREFIX):
            continue
        match = _SEARCH_KEY.fullmatch(key)
        if match is None:
            raise invalid(key, "is not a filter; search the payload as payload.<field>=<value>")
        name = match.group(1) if match.group(1) is not None else match.group(2)
        fault = limits.name_fault(name)
        if fault is not None:
            raise invalid(key, f"the field name {fault}; search as payload.<field>=<value>")
        if len(text.encode()) > SEARCH_VALUE_BYTES_MAX:
            raise invalid(key, f"the value is at most {SEARCH_VALUE_BYTES_MAX} bytes")
        if "\x00" in text:
            raise invalid(key, "the value holds U+0000, which no kept field can (rule 3)")
        value = scalar(text)
        if name in wanted and wanted[name] != value:
            raise invalid(key, "is given twice with different values; a task has one of them")
        wanted[name] = value
        if len(wanted) > SEARCH_FIELDS_MAX:
            raise invalid(key, f"at most {SEARCH_FIELDS_MAX} payload fields in one search")
    return _dumps(wanted) if wanted else None


def scalar(text: str) -> Any:
    """``text`` as a searched value (rule 4): the JSON scalar it spells, else the string."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if not isinstance(value, _SCALARS) or (type(value) is float and not math.isfinite(value)):
        return text
    return value
