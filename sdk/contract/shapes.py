"""The field types the models share: each one a JSON Schema and the node's check at once.

Rule 1: a string the client names a thing with (app, task type, queue, schedule id) is a
``Name``: the character set of ``schemas/limits.py``, as a pattern. Other strings (agent ids,
keys, cursors, filters) are ``Text``: any characters but control characters.
Rule 2: a byte limit that JSON Schema cannot state (it counts characters) is written in the
field's description; ``Meta.max_length`` is then the same number in characters, the bound
every ASCII string meets exactly, and the node's check counts bytes after decoding.
Rule 3: an optional field is ``X | None`` with default None: ``null`` reads as absent, so a
client may send every optional field explicitly.
"""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

from conveyor.contract.limits import DURATION_MS_MAX, INT_MAX, NAME_BYTES_MAX
from conveyor.schemas import limits

# Anchored with ``(?!\n)$``: Python's ``$`` (msgspec's checks, Hypothesis' generators) also
# matches before a final line feed, JSON Schema's does not; the lookahead makes them agree.
NAME_PATTERN = "^[A-Za-z0-9_.:\\-]+(?!\n)$"  # limits.NAME_CHARS
TEXT_PATTERN = "^[^\\x00-\\x1f\\x7f]+(?!\n)$"  # no control characters
TASK_ID_PATTERN = "^[0-9a-f]{32}(?!\n)$"

Name = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=limits.NAME_CHARS_MAX,
        pattern=NAME_PATTERN,
        description=limits.name_rule(),
        examples=["send_email"],
    ),
]
Text = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=NAME_BYTES_MAX,
        pattern=TEXT_PATTERN,
        description=f"1..{NAME_BYTES_MAX} bytes of UTF-8, no control characters",
    ),
]
TaskId = Annotated[
    str,
    Meta(pattern=TASK_ID_PATTERN, description="32 lowercase hex digits", examples=["0" * 32]),
]
Ms = Annotated[int, Meta(ge=0, le=DURATION_MS_MAX, description="milliseconds")]
PositiveMs = Annotated[int, Meta(ge=1, le=DURATION_MS_MAX, description="milliseconds")]
EpochMs = Annotated[int, Meta(description="milliseconds since the Unix epoch")]
Count = Annotated[int, Meta(ge=0)]
NonNegative = Annotated[int, Meta(ge=0, le=INT_MAX)]
Json = Annotated[Any, Meta(description="any JSON value")]
__all__ = ["INT_MAX", "NAME_BYTES_MAX"]  # read by the models from here


def bounded_text(bytes_max: int, description: str = "") -> Any:
    """Free text (messages, stacks, reasons) of at most ``bytes_max`` bytes (rule 2)."""
    words = f"at most {bytes_max} bytes of UTF-8"
    return Annotated[
        str,
        Meta(max_length=bytes_max, description=f"{description}; {words}" if description else words),
    ]
