-- A queue and a task type together (the dashboard's most common drill-down): without this, a
-- rare pair walks the tenant's queue or type index newest first, filtering, and one such
-- combination in `conveyor bench query` took 73 ms at p99 over 1,000,000 rows.
CREATE INDEX tasks_tenant_queue_type_created
    ON tasks (tenant, queue, task_type, created_ms DESC, task_id DESC);
