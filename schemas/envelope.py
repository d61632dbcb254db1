"""The envelope of an encoded payload, as the node stores it without reading it.

A client or agent with a payload codec (``conveyor.codecs``: compression, encryption with a
key the platform never holds) sends an encoded value as one JSON object:

    {"$codec": "conveyor/v1", "encoding": ["zlib", "aes-gcm"],
     "metadata": {"key_id": "shop-2"}, "data": "<base64>"}

``encoding`` names the codecs applied, first first. The node keeps such a value as it came
(payload, result, checkpoint, step value) and never decodes it; the one place it would read
a payload, the check against its task type's payload schema, is skipped for an envelope (the
SDK checks a typed payload before it encodes it). Only the SDK and a codec endpoint the user
runs decode it.
"""

from __future__ import annotations

from typing import Any

ENVELOPE_KEY = "$codec"
ENVELOPE_VERSION = "conveyor/v1"


def is_envelope(value: Any) -> bool:
    """Whether ``value`` is an encoded payload's envelope (of any version)."""
    return isinstance(value, dict) and isinstance(value.get(ENVELOPE_KEY), str)
