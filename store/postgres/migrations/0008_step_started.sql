-- When each step started: the time of the first event folded into its row (the durable claim
-- made before its body runs; for a step committed without a claim, such as a sleep or a wait,
-- its commit). `updated_ms` of a COMMITTED row is when it ended. Together they draw the
-- workflow page's timing waterfall. Rows projected before this column have no start (null).
ALTER TABLE steps ADD COLUMN started_ms bigint;
