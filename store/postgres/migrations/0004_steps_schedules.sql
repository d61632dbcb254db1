-- Steps and schedules, fed by the step and schedule events of the events stream.
-- The live step rows of a task are dropped when it ends (streams/machine/handlers/steps.py,
-- rule 5); this table keeps every step of every task, finished ones included, so the workflow
-- view and its history read here once the task is over. Rows carry `version` (the record-log
-- offset of the last event folded into them) and only move forward, like `tasks`.

CREATE TABLE steps (
    task_id     text    NOT NULL,
    identity    text    NOT NULL,
    tenant      text    NOT NULL,
    position    integer NOT NULL,
    state       text    NOT NULL,  -- CLAIMED | COMMITTED
    claims      integer NOT NULL,
    value       bytea,             -- the memoized bytes of a COMMITTED step
    wake_at_ms  bigint,            -- the deadline of a sleep step
    updated_ms  bigint  NOT NULL,
    version     bigint  NOT NULL,
    PRIMARY KEY (task_id, identity)
);

-- A schedule as it last stood; a deleted one stays as a tombstone (`deleted`) so that a
-- replayed older event cannot bring it back, and a new upsert of the id revives it.
CREATE TABLE schedules (
    tenant        text    NOT NULL,
    schedule_id   text    NOT NULL,
    cron          text    NOT NULL,
    timezone      text    NOT NULL,
    app           text    NOT NULL,
    task_type     text    NOT NULL,
    queue         text    NOT NULL,
    overlap       text    NOT NULL,
    catch_up      text    NOT NULL,
    paused        boolean NOT NULL,
    deleted       boolean NOT NULL,
    next_fire_ms  bigint,
    last_fire_ms  bigint,
    last_task_id  text,
    fired         bigint  NOT NULL,
    skipped       bigint  NOT NULL,
    created_ms    bigint  NOT NULL,
    updated_ms    bigint  NOT NULL,
    version       bigint  NOT NULL,
    PRIMARY KEY (tenant, schedule_id)
);
