"""The request limits the models state and the validators check: one definition of each."""

from __future__ import annotations

from conveyor.schemas.steps import STEP_KEY_BYTES_MAX, STEP_NAME_BYTES_MAX

INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # what the node's integers hold (int64)
NAME_BYTES_MAX = 200  # a name or a free-text field, in bytes of UTF-8
BATCH_MAX = 1_000
IDEMPOTENCY_KEY_BYTES_MAX = 256
PRIORITY_MAX = 9
RETRY_ATTEMPTS_MAX = 1_000
BACKOFF_FACTOR_MAX = 100.0
DURATION_MS_MAX = 100 * 365 * 86_400_000  # a century: keeps now + duration far inside int64
NON_RETRYABLE_MAX = 100
LIST_LIMIT_MAX = 1_000
LIST_LIMIT_DEFAULT = 100
WAIT_MS_MAX = 60_000
# ``run_at`` from the epoch (the machine stores instants as unsigned ms) to the last instant an
# RFC 3339 year of four digits can write.
RUN_AT_MIN = "1970-01-01T00:00:00Z"
RUN_AT_MAX = "9999-12-31T23:59:59.999Z"
RUN_AT_MS_MAX = 253_402_300_799_999
CURSOR_BYTES_MAX = 1_024
ERROR_TEXT_BYTES_MAX = 256  # the error_text filter
REASON_BYTES_MAX = 1_024  # a cancel's reason

TASK_TYPES_MAX = 1_000
QUEUES_MAX = 100
LEASE_MS_MIN, LEASE_MS_MAX = 100, 3_600_000
SIGNALS_WAIT_MS_MAX = 60_000  # a signals call answers [] after this long at most
IDENTITY_BYTES_MAX = STEP_NAME_BYTES_MAX + 1 + STEP_KEY_BYTES_MAX  # "name:key"
