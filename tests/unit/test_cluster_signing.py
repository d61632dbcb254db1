"""Node cards are believed only when signed with the cluster's secret
(``streams/cluster/signing.py``), and the directory drops the others
(``streams/cluster/directory.py``)."""

from __future__ import annotations

import json

import pytest

from conveyor.streams.cluster.directory import _note, owners
from conveyor.streams.cluster.signing import ClusterSecret, sign, verified

SECRET = ClusterSecret("a-cluster-secret-0123456789")
KEY = SECRET.card_key("prod")
CARD = {
    "node_id": "n1",
    "url": "http://127.0.0.1:7401",
    "ts_ms": 1_700_000_000_000,
    "leading": {"0": {"epoch": 3, "lag_records": 0}},
}


def test_a_signed_card_is_read_back_as_it_was() -> None:
    assert verified("n1", sign(CARD, KEY), KEY) == CARD


@pytest.mark.parametrize(
    "change",
    [
        {"url": "http://127.0.0.1:6666"},
        {"leading": {"0": {"epoch": 4, "lag_records": 0}}},
        {"ts_ms": 1_700_000_000_001},
        {"extra": 1},
    ],
)
def test_a_card_changed_after_signing_is_refused(change: dict[str, object]) -> None:
    forged = json.loads(sign(CARD, KEY))
    forged.update(change)
    assert verified("n1", json.dumps(forged).encode(), KEY) is None


def test_a_card_of_another_secret_another_cluster_or_another_key_is_refused() -> None:
    other = ClusterSecret("another-secret-0123456789")
    assert verified("n1", sign(CARD, other.card_key("prod")), KEY) is None
    assert verified("n1", sign(CARD, SECRET.card_key("staging")), KEY) is None
    assert verified("n2", sign(CARD, KEY), KEY) is None  # n1's card under n2's key
    for value in (json.dumps(CARD).encode(), b"not json", b"[1]", b'{"mac": 1}'):
        assert verified("n1", value, KEY) is None


def test_the_directory_keeps_a_nodes_good_card_over_a_forged_one() -> None:
    cards: dict[str, dict[str, object]] = {}
    assert _note(cards, b"n1", sign(CARD, KEY), KEY)
    evil = {**CARD, "node_id": "evil", "url": "http://attacker", "leading": {"0": {"epoch": 99}}}
    assert not _note(cards, b"evil", json.dumps(evil).encode(), KEY)
    forged_n1 = {**CARD, "url": "http://attacker", "mac": "0" * 64}
    assert not _note(cards, b"n1", json.dumps(forged_n1).encode(), KEY)
    assert cards == {"n1": CARD}
    assert owners(cards)[0]["url"] == "http://127.0.0.1:7401"


def test_the_secret_is_never_shown_and_a_short_one_is_refused_without_echoing_it() -> None:
    assert "0123456789" not in repr(SECRET) and "0123456789" not in str(SECRET)
    with pytest.raises(ValueError, match="has 9 characters") as refused:
        ClusterSecret("short-one")
    assert "short-one" not in str(refused.value)
