"""Ready lanes: which agents a ready task may be dealt to.

Rule 1: a task waits on the ready queues of one lane. A task of app A waits in lane ``A``,
which every agent of A takes from, unless it is a pinned workflow that has recorded the app
version V its first lease went to: it then waits in the lane ``pinned_lane(A, V)``, which only
agents serving V take from. An agent of A and V therefore polls two lanes; a pinned task that
has not had a lease yet waits in ``A`` like any other.
Rule 2: a task's lane never changes while it is ready (its version is recorded when it is
leased, after it left the queue), so the lane it was added under is the one it is removed from.
Rule 3: no agent serving V means the task stays ENQUEUED in its lane, however long: a pinned
workflow never silently moves to another version. The API shows what it waits for.
"""

from __future__ import annotations

from conveyor.schemas.resume import RESUME_PINNED
from conveyor.schemas.types import Task

# Apps and versions are printable names: a NUL cannot occur in either, so no app name can
# collide with a pinned lane.
_SEP = "\x00"


def pinned_lane(app: str, version: str) -> str:
    return f"{app}{_SEP}{version}"


def ready_lane(task: Task) -> str:
    if task.resume == RESUME_PINNED and task.app_version is not None:
        return pinned_lane(task.app, task.app_version)
    return task.app


def lanes_of(app: str, version: str | None) -> list[str]:
    """The lanes an agent of ``app`` serving ``version`` takes from (rule 1)."""
    return [app] if version is None else [app, pinned_lane(app, version)]


def app_of(lane: str) -> str:
    return lane.partition(_SEP)[0]
