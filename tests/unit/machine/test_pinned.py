"""The resume policy: a pinned workflow's later attempts go to agents of the app version its
first lease went to (``store/lanes.py``); a latest one's to any agent of its app."""

from __future__ import annotations

import io
import json

from fastavro import parse_schema, schemaless_writer

from conveyor.schemas import codec
from conveyor.schemas.types import Completion, Outcome, SleepStep, TaskStatus
from conveyor.store import keys
from conveyor.store.lanes import pinned_lane
from conveyor.streams.machine import Reply

from .harness import APP, Harness, actions_of, grants


def slept(h: Harness, resume: str) -> str:
    """A workflow whose first attempt, dealt to an agent of v1, slept 1 s and woke."""
    spec = h.spec(resume=resume)
    h.enqueue(spec)
    lease = h.lease_one(spec.task_id, app_version="v1")
    assert h.task(spec.task_id).app_version == "v1"
    step = SleepStep(identity="sleep#0", position=0, sleep_ms=1_000)
    h.report(
        Completion(task_id=spec.task_id, lease_id=lease.lease_id, outcome=Outcome.SLEEP, sleep=step)
    )
    h.fire_due(h.now_ms + 1_000)
    assert h.task(spec.task_id).status == TaskStatus.ENQUEUED
    return spec.task_id


def test_a_pinned_workflow_resumes_only_in_its_versions_lane() -> None:
    h = Harness()
    task_id = slept(h, "pinned")
    assert grants(h.grant(1, app_version="v2")) == []  # the app's lane: empty
    assert grants(h.grant(1, pinned_lane(APP, "v2"), app_version="v2")) == []
    assert h.task(task_id).status == TaskStatus.ENQUEUED
    (grant,) = grants(h.grant(1, pinned_lane(APP, "v1"), app_version="v1"))
    assert grant.task_id == task_id
    assert h.task(task_id).app_version == "v1"


def test_a_latest_workflow_resumes_on_any_version_and_keeps_its_first_version() -> None:
    h = Harness()
    task_id = slept(h, "latest")
    assert grants(h.grant(1, pinned_lane(APP, "v1"), app_version="v1")) == []
    (grant,) = grants(h.grant(1, app_version="v2"))
    assert grant.task_id == task_id
    assert h.task(task_id).app_version == "v1"  # recorded once, by the first lease


def test_a_pinned_retry_waits_for_its_version_too() -> None:
    h = Harness()
    spec = h.spec(resume="pinned", attempts_max=3)
    h.enqueue(spec)
    lease = h.lease_one(spec.task_id, app_version="v1")
    h.fail(spec.task_id, lease.lease_id, retry_after_ms=0)
    h.fire_due()
    assert grants(h.grant(1, app_version="v2")) == []
    (grant,) = grants(h.grant(1, pinned_lane(APP, "v1"), app_version="v1"))
    assert grant.attempt == 2


def test_a_pinned_task_leased_by_an_agent_without_a_version_stays_in_the_apps_lane() -> None:
    h = Harness()
    task_id = slept_without_version(h)
    (grant,) = grants(h.grant(1, app_version="v9"))
    assert grant.task_id == task_id
    assert h.task(task_id).app_version == "v9"


def slept_without_version(h: Harness) -> str:
    spec = h.spec(resume="pinned", attempts_max=3)
    h.enqueue(spec)
    lease = h.lease_one(spec.task_id)  # an agent that told no version
    h.fail(spec.task_id, lease.lease_id, retry_after_ms=0)
    h.fire_due()
    return spec.task_id


def test_an_unknown_resume_policy_is_refused_and_changes_nothing() -> None:
    h = Harness()
    before = h.dump(applied=False, outbox=False)
    (reply,) = actions_of(h.enqueue(h.spec(resume="sticky")), Reply)
    assert not reply.ok and reply.reason == "resume 'sticky' is not one of latest|pinned"
    assert h.dump(applied=False, outbox=False) == before


def test_a_spec_written_before_resume_existed_decodes_as_latest() -> None:
    path = codec.SCHEMA_DIR / "records" / "history" / "TaskSpec.v1.avsc"
    old = parse_schema(json.loads(path.read_text()), named_schemas={})
    spec = Harness().spec(run_key="rk")
    datum = {name: getattr(spec, name) for name in codec.TASK_SPEC.names if name != "resume"}
    buf = io.BytesIO()
    schemaless_writer(buf, old, datum)
    decoded = codec.TASK_SPEC.decode(buf.getvalue())
    assert decoded == spec and decoded.resume == "latest"


def test_a_task_writes_no_detail_row_for_its_version_or_flags() -> None:
    """The version goes into the state row the lease writes anyway; a new task's default
    compensation flags are no reason to write the rarely-changing detail row."""
    h = Harness()
    spec = h.spec(resume="pinned")
    h.enqueue(spec)
    h.lease_one(spec.task_id, app_version="v1")
    assert keys.detail(spec.task_id) not in h.kv.data
    fresh = h.fresh_task(spec.task_id)
    assert fresh is not None and fresh.app_version == "v1" and fresh.resume == "pinned"
