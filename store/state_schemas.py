"""Which state-row schemas a partition's RocksDB store was written with.

Rule: state is derived from the log, and the log is never trimmed, so a store written under
other state schemas is not migrated row by row: it is dropped, and the processor rebuilds it by
replaying the log from the start, as it does for any empty store. The fingerprint of the state
schemas (``schemas/state/*.avsc``, docs left out) and of the key layout (``keys.LAYOUT``) sits
in a file beside each store; a store without one predates the file and is rebuilt once. A
rebuild re-ships the events of the whole log; their consumers dedupe by version (the outbox's
at-least-once contract).

With partition snapshots on (a node on Kafka given ``--snapshots``), the log is trimmed below
the oldest snapshot kept, and ``streams/cluster/snapshots.py`` restores only snapshots written
under this build's schemas: a build that changes them cannot rebuild a trimmed partition and
does not lead it (``RestoreFailed``). Changing the state schemas of such a cluster needs a
migration of its snapshots, which does not exist yet.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from conveyor.schemas.codec import SCHEMA_DIR
from conveyor.store import keys
from conveyor.store.rocksdb import RocksKV

log = logging.getLogger("conveyor.store")


def _canonical(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _canonical(v) for k, v in sorted(node.items()) if k != "doc"}
    if isinstance(node, list):
        return [_canonical(v) for v in node]
    return node


def fingerprint() -> str:
    docs: dict[str, Any] = {
        path.name: _canonical(json.loads(path.read_text()))
        for path in sorted((Path(SCHEMA_DIR) / "state").glob("*.avsc"))
    }
    docs["keys.LAYOUT"] = keys.LAYOUT  # the key layout is part of what a store was written under
    return hashlib.sha256(json.dumps(docs, sort_keys=True).encode()).hexdigest()


def open_state(path: Path) -> RocksKV:
    """The store at ``path``, emptied first if it was written under other state schemas."""
    mark = path.with_name(path.name + ".schemas")
    want = fingerprint()
    have = mark.read_text().strip() if mark.exists() else None
    if have != want:
        if path.exists():
            log.warning(
                "%s was written under other state schemas (%s): rebuilding it from the log",
                path,
                "unknown" if have is None else have[:12],
            )
            shutil.rmtree(path)
        tmp = mark.with_suffix(".tmp")
        tmp.write_text(want + "\n")
        os.replace(tmp, mark)
    return RocksKV(path)
