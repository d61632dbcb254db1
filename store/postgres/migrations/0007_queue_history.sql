-- Queue history: what happened per (tenant, minute, queue, task type), folded by the projector
-- (store/postgres/history.py) in the transaction that writes the task rows of the same events.
-- Counts are added, never replaced, so each event must be counted once: `history_marks` keeps,
-- per partition of the record log, the offset of the newest record whose events are counted;
-- an event at or below it (re-read after a restart, shipped twice by the outbox) is skipped.
--
-- The histograms are arrays of counts over fixed buckets of milliseconds, a factor of sqrt(2)
-- apart (history.py: BUCKET_BOUNDS_MS), so the p50 and p99 of any window are read off the sum
-- of its rows' arrays to within that factor.

CREATE TABLE queue_history (
    tenant     text    NOT NULL,
    minute_ms  bigint  NOT NULL,   -- start of the minute, by the records' stamps
    queue      text    NOT NULL,
    task_type  text    NOT NULL,
    enqueued   bigint  NOT NULL DEFAULT 0,  -- TaskEnqueued
    started    bigint  NOT NULL DEFAULT 0,  -- TaskLeased
    succeeded  bigint  NOT NULL DEFAULT 0,
    failed     bigint  NOT NULL DEFAULT 0,  -- TaskFailed
    canceled   bigint  NOT NULL DEFAULT 0,
    expired    bigint  NOT NULL DEFAULT 0,
    retried    bigint  NOT NULL DEFAULT 0,  -- TaskRetryScheduled: an attempt failed, another comes
    wait_hist  bigint[] NOT NULL,           -- schedule-to-start: lease time - ready time
    run_hist   bigint[] NOT NULL,           -- attempt duration: its end - its lease time
    PRIMARY KEY (tenant, minute_ms, queue, task_type)
);

CREATE TABLE history_marks (
    partition     integer PRIMARY KEY,
    record_offset bigint  NOT NULL
);
