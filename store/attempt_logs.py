"""What each attempt printed, kept for people to read, never read by the engine.

Rule 1 (fenced): the gateway stores a log only after the node accepted the completion that
carried it, so a zombie's late completion leaves no log behind.
Rule 2 (diagnostics, not state): a log is written atomically (a reader sees all of it or
none) but not fsync'd, and is not part of the task's state: a crash may lose the newest ones,
and a lost log never changes what happened to a task.
Rule 3 (one per lease): a lease id names one attempt of one task for good.

    root/<task id>/<lease id>.log
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_TASK_ID = re.compile(r"^[0-9a-f]{32}$")


class AttemptLogs:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, task_id: str, lease_id: int) -> Path:
        if not _TASK_ID.match(task_id):  # never let an id name a path outside the root
            raise ValueError(f"not a task id: {task_id!r}")
        return self.root / task_id / f"{lease_id}.log"

    def put(self, task_id: str, lease_id: int, text: str) -> None:
        path = self._path(task_id, lease_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)

    def get(self, task_id: str, lease_id: int) -> str | None:
        try:
            return self._path(task_id, lease_id).read_text(encoding="utf-8")
        except (OSError, ValueError):
            return None

    def leases(self, task_id: str) -> set[int]:
        """The leases of ``task_id`` that left a log."""
        try:
            names = os.listdir(self._path(task_id, 0).parent)
        except (OSError, ValueError):
            return set()
        return {int(n[:-4]) for n in names if n.endswith(".log") and n[:-4].isdigit()}
