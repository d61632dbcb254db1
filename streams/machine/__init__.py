"""The pure core: apply(tables, record, meta) -> Outcome. No I/O, no clock, no randomness."""

from conveyor.streams.machine.apply import apply, current_epoch
from conveyor.streams.machine.outcome import (
    Action,
    CancelLease,
    Grant,
    LeaseEnded,
    Meta,
    Offer,
    Outcome,
    Refusal,
    Reply,
    TaskFinished,
)

__all__ = [
    "Action",
    "CancelLease",
    "Grant",
    "LeaseEnded",
    "Meta",
    "Offer",
    "Outcome",
    "Refusal",
    "Reply",
    "TaskFinished",
    "apply",
    "current_epoch",
]
