-- Indexes for the list queries that `conveyor bench query` found slow over 1,000,000 rows.

-- Text in the error message (no pg_trgm in the embedded server): a search walks the tenant's
-- rows that have an error, newest first, a bounded number per page (queries.list_page); this
-- index holds only those rows, with the message, so the walk reads neither the error-free
-- majority nor the heap.
CREATE INDEX tasks_tenant_errors ON tasks (tenant, created_ms DESC, task_id DESC)
    INCLUDE (error_message) WHERE error_message IS NOT NULL;
