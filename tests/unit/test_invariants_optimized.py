"""Guards on state stay on under ``python -O``, which strips every ``assert``.

A broken invariant must stop the processor, not be skipped: the machine, the tables and the
dispatch ledger raise ``InvariantError`` from explicit checks. The scenario runs in a child
interpreter started with ``-O`` (so ``__debug__`` is False there and an ``assert`` would pass
silently); it enqueues, leases and completes a task through the real machine, then asks for an
illegal move of the finished task and an out-of-range record index.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from tests.unit.machine.harness import Harness, grants
    from conveyor.errors import InvariantError
    from conveyor.schemas.types import TaskStatus
    from conveyor.streams.machine.lifecycle import ready_seq
    from conveyor.streams.machine.transitions import move

    assert False, "asserts run: this interpreter was not started with -O"
    print("debug", __debug__)
    h = Harness()
    spec = h.spec()
    h.enqueue(spec)
    (grant,) = grants(h.grant(capacity=1))
    h.complete(grant.task_id, grant.lease_id)
    task = h.tables.task(grant.task_id)
    print("status", task.status.value)
    try:
        move(task, TaskStatus.LEASED)
    except InvariantError as exc:
        print("caught", exc.code, str(exc).split(" of ")[0])
    print("status after", h.tables.task(grant.task_id).status.value)
    try:
        ready_seq(h.history[-1].meta, -1)
    except InvariantError as exc:
        print("caught", exc.code, exc)
    """
)


def test_a_broken_invariant_is_caught_under_python_O() -> None:
    proc = subprocess.run(
        [sys.executable, "-O", "-c", SCENARIO, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "debug False"  # -O took: a bare assert would have been skipped
    assert lines[1] == "status SUCCEEDED"
    assert lines[2] == "caught internal_error illegal move SUCCEEDED -> LEASED"
    assert lines[3] == "status after SUCCEEDED"  # nothing changed
    assert lines[4].startswith("caught internal_error record item index -1 out of range")
