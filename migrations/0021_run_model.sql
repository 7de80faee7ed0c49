-- Up Migration
-- A continuation may run on another model than its child session's (DelegateContinue's model argument).
-- The choice belongs to that one call: every turn of the call, including its recovery after a restart,
-- reads it from the call's row; the child session's own model is unchanged, so a later continuation
-- without a model runs on the session's model again. Additive and nullable: existing calls keep null.
alter table subagent_runs add column model text check (model is null or length(model) between 1 and 200);

-- Down Migration
alter table subagent_runs drop column model;
