"""Key encodings of the partition tables. One keyspace, one leading byte per table.

Keys sort correctly: integers are big-endian, strings are length-prefixed (u16) so that
"ab" + "c" never collides with "a" + "bc".

    table        key                                              value
    tasks        t task_id                                        TaskState (Avro)
    heads        h task_id                                        TaskHead (Avro)
    details      x task_id                                        TaskDetail (Avro), if any
    specs        s task_id                                        TaskSpec (Avro, as enqueued)
    payloads     p task_id                                        the spec's payload bytes
    traces       z task_id                                        the spec's trace context
                                                                  (JSON), if it has one
    attempts     a lp:task_id u32:attempt                         Attempt (Avro); attempts that
                                                                  did not end the task (the
                                                                  last one is in the task row)
    idempotency  i lp:tenant lp:app key                           IdempotencyEntry (Avro)
    ready        r lp:app lp:tenant lp:type lp:queue u8:255-prio  task_id
                   u64:seq
    ready count  c lp:app tenant                                  u64 (absent when 0)
    queue count  k lp:app lp:tenant lp:type queue                 u64 (absent when 0)
    queue head   m head/ lp:app lp:tenant lp:type lp:queue        the ready key taken last
    timers       T u64:fire_at_ms lp:task_id u8:kind u64:token    b""
    leased       l task_id                                        u64:lease_id
    dead         d lp:tenant task_id                              b""
    steps        S lp:task_id identity                            StepRow (Avro)
    step totals  S lp:task_id  (the bare prefix, sorts first)     StepTotals (Avro)
    schedules    C lp:tenant schedule_id                          Schedule (Avro)
    barriers     W lp:parent_id identity                          Barrier (Avro)
    stripes      V lp:parent_id lp:identity 0 u8:stripe           u64: children not landed
    results      V lp:parent_id lp:identity 1 u32:index           ChildResult (Avro)
    children     P child_id                                       ChildLink (Avro)
    waits        Q task_id                                        EventWait (Avro)
    inbox        N lp:task_id lp:name u64:seq                     an event's payload, kept
    outbox       o u64:offset                                     EventBatch (Avro)
    messages     M u64:offset u32:seq                             u16:partition + a record for
                                                                  that partition's log (shipped
                                                                  then deleted: ``messages.py``)
    meta         m name                                           per name
    paused       m paused/ lp:tenant queue                        b"" (a paused queue)
    registry     R lp:tenant u8:table name                        JSON (``store/catalog.py``)
"""

from __future__ import annotations

import functools
import struct

from conveyor.frozen import frozen
from conveyor.schemas.types import TimerKind, TimerRef

TASKS = b"t"
HEADS = b"h"
DETAILS = b"x"
SPECS = b"s"
PAYLOADS = b"p"
TRACES = b"z"
ATTEMPTS = b"a"
IDEMPOTENCY = b"i"
READY = b"r"
READY_COUNTS = b"c"
QUEUE_COUNTS = b"k"
TIMERS = b"T"
LEASED = b"l"
DEAD = b"d"
STEPS = b"S"
SCHEDULES = b"C"
BARRIERS = b"W"
SLOTS = b"V"
CHILDREN = b"P"
WAITS = b"Q"
INBOX = b"N"
OUTBOX = b"o"
MESSAGES = b"M"
META = b"m"
REGISTRY = b"R"

META_APPLIED = META + b"applied"
META_EPOCH = META + b"epoch"
META_CURSOR = META + b"cursor/"  # + app: the tenant served last (round-robin position)
META_PAUSED = META + b"paused/"  # + lp:tenant queue: a paused queue (PauseQueue)

# The layout of the keys above, part of a store's state fingerprint (``state_schemas.py``): a
# store written under another layout is rebuilt from the log. 2: ready queues per task type.
LAYOUT = 2

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_TIMER_KINDS = list(TimerKind)
_TIMER_CODE = {kind: i for i, kind in enumerate(_TIMER_KINDS)}


def u64(n: int) -> bytes:
    return _U64.pack(n)


def read_u64(b: bytes, at: int = 0) -> int:
    value: int = _U64.unpack_from(b, at)[0]
    return value


def read_u32(b: bytes, at: int = 0) -> int:
    value: int = _U32.unpack_from(b, at)[0]
    return value


def lp(s: str) -> bytes:
    raw = s.encode()
    return _U16.pack(len(raw)) + raw


def read_lp(b: bytes, at: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(b, at)
    return b[at + 2 : at + 2 + n].decode(), at + 2 + n


def task(task_id: str) -> bytes:
    return TASKS + task_id.encode()


def head(task_id: str) -> bytes:
    return HEADS + task_id.encode()


def detail(task_id: str) -> bytes:
    return DETAILS + task_id.encode()


def spec(task_id: str) -> bytes:
    return SPECS + task_id.encode()


def payload(task_id: str) -> bytes:
    return PAYLOADS + task_id.encode()


def trace(task_id: str) -> bytes:
    return TRACES + task_id.encode()


def attempt(task_id: str, n: int) -> bytes:
    return ATTEMPTS + lp(task_id) + _U32.pack(n)


def attempts_of(task_id: str) -> bytes:
    return ATTEMPTS + lp(task_id)


def idempotency(tenant: str, app: str, key: str) -> bytes:
    return IDEMPOTENCY + lp(tenant) + lp(app) + key.encode()


def ready_tenant(app: str, tenant: str) -> bytes:
    return READY + lp(app) + lp(tenant)


def ready_queue(app: str, tenant: str, task_type: str, queue: str) -> bytes:
    return READY + lp(app) + lp(tenant) + lp(task_type) + lp(queue)


def ready(app: str, tenant: str, task_type: str, queue: str, priority: int, seq: int) -> bytes:
    return ready_queue(app, tenant, task_type, queue) + bytes((255 - priority,)) + _U64.pack(seq)


def ready_count(app: str, tenant: str) -> bytes:
    return READY_COUNTS + lp(app) + tenant.encode()


def ready_count_of(app: str) -> bytes:
    return READY_COUNTS + lp(app)


def queue_count(app: str, tenant: str, task_type: str, queue: str) -> bytes:
    return QUEUE_COUNTS + lp(app) + lp(tenant) + lp(task_type) + queue.encode()


def queue_count_of(app: str, tenant: str) -> bytes:
    return QUEUE_COUNTS + lp(app) + lp(tenant)


def queue_head(app: str, tenant: str, task_type: str, queue: str) -> bytes:
    return META + b"head/" + lp(app) + lp(tenant) + lp(task_type) + lp(queue)


@frozen
class QueueKeys:
    """Every key of one (app, tenant, task type, queue) ready queue, built once: dispatch
    touches them for every task."""

    prefix: bytes
    tenant_count: bytes
    queue_count: bytes
    head: bytes

    def ready(self, priority: int, seq: int) -> bytes:
        return self.prefix + bytes((255 - priority,)) + _U64.pack(seq)


@functools.lru_cache(maxsize=4_096)
def queue_keys(app: str, tenant: str, task_type: str, queue: str) -> QueueKeys:
    return QueueKeys(
        prefix=ready_queue(app, tenant, task_type, queue),
        tenant_count=ready_count(app, tenant),
        queue_count=queue_count(app, tenant, task_type, queue),
        head=queue_head(app, tenant, task_type, queue),
    )


def ready_order(key: bytes) -> bytes:
    """The (priority, seq) tail of a ready key: compares across the queues and task types of
    one tenant."""
    return key[-9:]


def timer(ref: TimerRef) -> bytes:
    return (
        TIMERS
        + _U64.pack(ref.fire_at_ms)
        + lp(ref.task_id)
        + bytes((_TIMER_CODE[ref.kind],))
        + _U64.pack(ref.token)
    )


def timers_until(fire_at_ms: int) -> bytes:
    """Exclusive upper bound of the timers due at or before ``fire_at_ms``."""
    return TIMERS + _U64.pack(fire_at_ms + 1)


def parse_timer(key: bytes) -> TimerRef:
    fire_at_ms = read_u64(key, 1)
    task_id, at = read_lp(key, 9)
    return TimerRef(
        fire_at_ms=fire_at_ms,
        task_id=task_id,
        kind=_TIMER_KINDS[key[at]],
        token=read_u64(key, at + 1),
    )


def leased(task_id: str) -> bytes:
    return LEASED + task_id.encode()


def dead(tenant: str, task_id: str) -> bytes:
    return DEAD + lp(tenant) + task_id.encode()


def dead_of(tenant: str) -> bytes:
    return DEAD + lp(tenant)


def outbox(offset: int) -> bytes:
    return OUTBOX + _U64.pack(offset)


def message(offset: int, seq: int) -> bytes:
    return MESSAGES + _U64.pack(offset) + _U32.pack(seq)


def message_value(partition: int, data: bytes) -> bytes:
    return _U16.pack(partition) + data


def parse_message_value(value: bytes) -> tuple[int, bytes]:
    """(target partition, the encoded record) of a message row."""
    (partition,) = _U16.unpack_from(value, 0)
    return partition, value[2:]


def cursor(app: str) -> bytes:
    return META_CURSOR + app.encode()


def paused_queues_of(tenant: str) -> bytes:
    return META_PAUSED + lp(tenant)


def paused_queue(tenant: str, queue: str) -> bytes:
    return META_PAUSED + lp(tenant) + queue.encode()


def steps_of(task_id: str) -> bytes:
    """The totals row of a task's steps, and the prefix of its step rows."""
    return STEPS + lp(task_id)


def step(task_id: str, identity: str) -> bytes:
    return STEPS + lp(task_id) + b"/" + identity.encode()


def schedule(tenant: str, schedule_id: str) -> bytes:
    return SCHEDULES + lp(tenant) + schedule_id.encode()


def schedules_of(tenant: str) -> bytes:
    return SCHEDULES + lp(tenant)


# A SCHEDULE timer names its schedule in the timer's task_id slot. NUL cannot occur in a
# tenant name (names have no control characters), so the split is unambiguous.
_SCHEDULE_SEP = "\x00"


def schedule_ref(tenant: str, schedule_id: str) -> str:
    return tenant + _SCHEDULE_SEP + schedule_id


def parse_schedule_ref(ref: str) -> tuple[str, str] | None:
    tenant, sep, schedule_id = ref.partition(_SCHEDULE_SEP)
    return (tenant, schedule_id) if sep else None


def barrier(parent_id: str, identity: str) -> bytes:
    return BARRIERS + lp(parent_id) + identity.encode()


def barriers_of(parent_id: str) -> bytes:
    return BARRIERS + lp(parent_id)


def stripe(parent_id: str, identity: str, n: int) -> bytes:
    return SLOTS + lp(parent_id) + lp(identity) + b"\x00" + bytes((n,))


def child_result(parent_id: str, identity: str, index: int) -> bytes:
    return SLOTS + lp(parent_id) + lp(identity) + b"\x01" + _U32.pack(index)


def child_results_of(parent_id: str, identity: str) -> bytes:
    return SLOTS + lp(parent_id) + lp(identity) + b"\x01"


def child(child_id: str) -> bytes:
    return CHILDREN + child_id.encode()


def wait(task_id: str) -> bytes:
    return WAITS + task_id.encode()


def inbox(task_id: str, name: str, seq: int) -> bytes:
    return inbox_of(task_id, name) + _U64.pack(seq)


def inbox_of(task_id: str, name: str) -> bytes:
    return INBOX + lp(task_id) + lp(name)


def registry(tenant: str, table: bytes, name: bytes = b"") -> bytes:
    """A row of the tenant's task types and schema registry (``store/catalog.py``)."""
    return REGISTRY + lp(tenant) + table + name
