"""Size limits of the worker protocol, shared by both ends of it: the agent truncates what a
guest reports to them, and the gateway refuses anything past them (a 400 naming the field)."""

from __future__ import annotations

import re

ERROR_CLASS_BYTES_MAX = 200
ERROR_MESSAGE_BYTES_MAX = 16 * 1024
ERROR_STACK_BYTES_MAX = 64 * 1024
ATTEMPT_LOG_BYTES_MAX = 64 * 1024  # the tail of what an attempt printed
POLL_CAPACITY_MAX = 1_000  # leases one poll may ask for; an agent holding more asks again
WORKER_ITEMS_MAX = 1_000  # leases, completions, checkpoints or steps in one call

# Names a client chooses (app, task type, queue, schedule id, event name): what both the SDK
# (at decoration time) and the gateway (a 400 naming the field) accept. ASCII letters, digits
# and ``_ . : -`` only, so a dotted module path (``shop.tasks.resize``) or a namespaced name
# (``billing:refund``) fits, and nothing that renders differently from what it is does: no
# control character, no space, no bidirectional override, no look-alike letter from another
# script, no two spellings of one name under Unicode normalization.
NAME_CHARS_MAX = 200
NAME_CHARS = "A-Z a-z 0-9 _ . : -"
_NAME_CHAR = re.compile(r"[A-Za-z0-9_.:\-]")
_NAME = re.compile(r"[A-Za-z0-9_.:\-]+")


def name_rule(chars_max: int = NAME_CHARS_MAX) -> str:
    return f"1..{chars_max} characters from {NAME_CHARS}"


def is_name(value: object, chars_max: int = NAME_CHARS_MAX) -> bool:
    return isinstance(value, str) and len(value) <= chars_max and _NAME.fullmatch(value) is not None


def name_fault(value: object, chars_max: int = NAME_CHARS_MAX) -> str | None:
    """Why ``value`` is not a name (None when it is one), naming a bad character by its code
    point: quoted, a bidirectional override would reorder the message itself."""
    if is_name(value, chars_max):
        return None
    if not isinstance(value, str):
        return "must be a string"
    if not 0 < len(value) <= chars_max:
        return f"must be {name_rule(chars_max)}; got {len(value)} characters"
    at, bad = next((i, c) for i, c in enumerate(value) if _NAME_CHAR.fullmatch(c) is None)
    return f"must be {name_rule(chars_max)}; got U+{ord(bad):04X} at index {at}"
