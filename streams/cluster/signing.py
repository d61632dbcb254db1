"""Node cards are signed: a node believes only what a node of its own cluster announced.

A card names the URL a node serves on, and the other nodes send requests there with the
caller's bearer key (``gateway/forward.py`` rule 4); agents poll the URLs ``/worker/nodes``
lists with their agent key. Anyone who can write to the broker can write to
``<cluster>-nodes``, so an unchecked card would let them name their own URL as the owner of
every partition and collect users' keys. So:

1. Every node of a cluster is given the same secret (``--cluster-secret`` or
   ``CONVEYOR_CLUSTER_SECRET``, at least ``SECRET_CHARS_MIN`` characters); a node on Kafka
   does not start without it.
2. A card carries ``mac``: HMAC-SHA256 over the card's canonical JSON (sorted keys, no
   spaces, without ``mac``), keyed by HMAC-SHA256(secret, ``conveyor nodes card`` + the
   cluster's name), so a card of another cluster that shares the secret is no card here.
3. A card is believed only if its ``mac`` checks and its ``node_id`` is the message's key.
   One that does not is dropped (a node's earlier good card stays) and a warning names the
   key it came under; it never becomes an owner, a forwarding target or a node agents poll.
4. The secret is never logged, printed or put in a card; ``ClusterSecret`` hides it from
   ``repr``.

What a signature does not stop: someone with the broker can delete or replay cards. A
tombstone is undone by the node's next card (every ``PUBLISH_S``); a replayed card is one a
node of this cluster really published, so it names a URL of that node and epochs that a
newer card outranks.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

SECRET_CHARS_MIN = 16
SECRET_ENV = "CONVEYOR_CLUSTER_SECRET"
MAC = "mac"
_CONTEXT = b"conveyor nodes card\x00"
_CALL_CONTEXT = b"conveyor node call\x00"


class ClusterSecret:
    """The cluster's shared secret; its ``repr`` and ``str`` never show it (rule 4)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if len(value) < SECRET_CHARS_MIN:
            raise ValueError(
                f"the cluster secret has {len(value)} characters; give at least "
                f"{SECRET_CHARS_MIN} (e.g. the output of: python3 -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'), the same on every node"
            )
        self._value = value.encode()

    def __repr__(self) -> str:
        return "ClusterSecret(<hidden>)"

    __str__ = __repr__

    def card_key(self, cluster: str) -> bytes:
        """The key that signs the cards of ``cluster`` (rule 2)."""
        return hmac.new(self._value, _CONTEXT + cluster.encode(), hashlib.sha256).digest()

    def call_key(self, cluster: str) -> bytes:
        """The key that signs the calls one node of ``cluster`` makes to another
        (``gateway/forward.py``, calls between nodes): another key than the cards'."""
        return hmac.new(self._value, _CALL_CONTEXT + cluster.encode(), hashlib.sha256).digest()


def _canonical(card: dict[str, Any]) -> bytes:
    return json.dumps(card, sort_keys=True, separators=(",", ":")).encode()


def sign(card: dict[str, Any], key: bytes) -> bytes:
    """The card as published: its JSON with ``mac``."""
    unsigned = {k: v for k, v in card.items() if k != MAC}
    mac = hmac.new(key, _canonical(unsigned), hashlib.sha256).hexdigest()
    return json.dumps({**unsigned, MAC: mac}).encode()


def verified(node_id: str, value: bytes, key: bytes) -> dict[str, Any] | None:
    """The card in ``value`` if it is signed with ``key`` and is ``node_id``'s; else None."""
    try:
        card = json.loads(value)
    except ValueError:
        return None
    if not isinstance(card, dict):
        return None
    mac = card.pop(MAC, None)
    if not isinstance(mac, str) or card.get("node_id") != node_id:
        return None
    expected = hmac.new(key, _canonical(card), hashlib.sha256).hexdigest()
    return card if hmac.compare_digest(mac, expected) else None
