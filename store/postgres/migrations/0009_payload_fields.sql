-- Searchable payload fields: the top-level scalars of a task's payload as the gateway copied
-- them at enqueue (its TaskEnqueued carries them), null for a task with none or enqueued
-- before they were kept. `GET /v1/tasks?payload.<field>=<value>` lists the rows whose fields
-- contain every pair asked for (`payload_fields @> '{...}'`), which this index answers.
ALTER TABLE tasks ADD COLUMN payload_fields jsonb;
CREATE INDEX tasks_payload_fields ON tasks USING gin (payload_fields jsonb_path_ops);
