-- Bulk operations: retry or cancel every task a list filter matches, run by the node in the
-- background in batches. The row is the operation's durable progress: the keyset cursor of
-- the last batch submitted, advanced after the batch's records are applied, so a node that
-- restarts resumes every 'running' operation from its cursor (a batch submitted twice is
-- harmless: retrying a retried task or canceling a canceled one changes nothing).

CREATE TABLE operations (
    operation_id      text    PRIMARY KEY,
    tenant            text    NOT NULL,
    kind              text    NOT NULL,  -- 'retry' | 'cancel'
    filter            jsonb   NOT NULL,  -- the task query, frozen at creation (created_to_ms set)
    reason            text,              -- cancel reason
    limit_tasks       bigint,            -- stop after this many tasks (null: every match)
    state             text    NOT NULL,  -- 'running' | 'done' | 'failed'
    matched           bigint,            -- tasks the filter matched at start (null: not counted yet)
    done              bigint  NOT NULL DEFAULT 0,  -- tasks submitted and applied
    changed           bigint  NOT NULL DEFAULT 0,  -- of those: re-enqueued / canceled or stopping
    cursor_created_ms bigint,            -- keyset of the last task done: (created_ms, task_id)
    cursor_task_id    text,
    created_ms        bigint  NOT NULL,
    updated_ms        bigint  NOT NULL,
    error             text
);

CREATE INDEX operations_running ON operations (created_ms) WHERE state = 'running';
