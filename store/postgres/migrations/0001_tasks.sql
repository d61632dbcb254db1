-- The query snapshot of tasks, fed by the projector from the events stream.
-- Every row carries `version`: the record-log offset of the last event folded into it. A
-- task lives on one partition, so offsets of its events are totally ordered and an upsert
-- that carries an older or equal version changes nothing (replays are harmless).

CREATE TABLE tasks (
    task_id       text PRIMARY KEY,
    tenant        text    NOT NULL,
    app           text    NOT NULL,
    task_type     text    NOT NULL,
    queue         text    NOT NULL,
    partition     integer NOT NULL,
    status        text    NOT NULL,
    attempt       integer NOT NULL,
    created_ms    bigint  NOT NULL,
    updated_ms    bigint  NOT NULL,
    finished_ms   bigint,
    ready_ms      bigint,   -- when it last became ready to lease (age of the oldest ready task)
    leased_ms     bigint,   -- when the current or last attempt started
    agent_id      text,
    error_class   text,
    error_message text,
    last_event    text    NOT NULL,
    version       bigint  NOT NULL
);

-- Listing is newest first within a tenant, keyset-paginated on (created_ms, task_id); each
-- filter the API offers leads one index so a page reads only the rows it returns.
CREATE INDEX tasks_tenant_created ON tasks (tenant, created_ms DESC, task_id DESC);
CREATE INDEX tasks_tenant_status_created ON tasks (tenant, status, created_ms DESC, task_id DESC);
CREATE INDEX tasks_tenant_type_created ON tasks (tenant, task_type, created_ms DESC, task_id DESC);
CREATE INDEX tasks_tenant_queue_created ON tasks (tenant, queue, created_ms DESC, task_id DESC);
CREATE INDEX tasks_tenant_error_class ON tasks (tenant, error_class, created_ms DESC, task_id DESC)
    WHERE error_class IS NOT NULL;
CREATE INDEX tasks_tenant_finished ON tasks (tenant, finished_ms DESC)
    WHERE finished_ms IS NOT NULL;

-- Text in the error message: a trigram index where the server has pg_trgm (the embedded
-- pgserver build does not; there ILIKE scans the tenant's rows that have an error).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm') THEN
        CREATE EXTENSION IF NOT EXISTS pg_trgm;
        CREATE INDEX tasks_error_trgm ON tasks USING gin (error_message gin_trgm_ops);
    END IF;
END
$$;

-- One row per attempt that was leased: started by TaskLeased, closed by the event ending it.
CREATE TABLE attempts (
    task_id       text    NOT NULL,
    attempt       integer NOT NULL,
    agent_id      text,
    started_ms    bigint  NOT NULL,
    finished_ms   bigint,
    outcome       text,
    error_class   text,
    error_message text,
    PRIMARY KEY (task_id, attempt)
);

-- The next events-log offset to read, per partition of the events stream. Advanced in the
-- same transaction as the rows it covers, so rows and watermark never disagree.
CREATE TABLE watermarks (
    partition integer PRIMARY KEY,
    next_offset bigint NOT NULL
);
