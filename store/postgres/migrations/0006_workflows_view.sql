-- Workflows: a workflow is a task whose body records steps (ctx.step, ctx.parallel,
-- ctx.wait_for_event, ctx.version), so this is a view over `tasks` and `steps`, not a table
-- the projector must keep in step with them: one row per task that recorded a step, with its
-- step counts. Its children are tasks too (ids derived from the parent: see the workflow API).
CREATE VIEW workflows AS
SELECT t.task_id     AS workflow_id,
       t.tenant,
       t.app,
       t.task_type,
       t.status,
       t.created_ms,
       t.finished_ms,
       count(*)                                           AS steps,
       count(*) FILTER (WHERE s.state = 'COMMITTED')      AS steps_committed,
       count(*) FILTER (WHERE s.identity LIKE 'sleep#%')  AS sleeps,
       max(s.updated_ms)                                  AS last_step_ms
FROM tasks t
JOIN steps s ON s.task_id = t.task_id
GROUP BY t.task_id;
