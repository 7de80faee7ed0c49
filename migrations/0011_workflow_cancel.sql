-- Up Migration
-- A Stop asked of a daemon that does not drive the workflow: recorded on the row (and announced with
-- pg_notify on channel crw_workflow_cancel) for the process that holds the workflow's lease, which
-- cancels it as its own Stop; a booting daemon that claims the workflow honours it too.
alter table workflows add column cancel_requested_at timestamptz;

-- Down Migration
alter table workflows drop column cancel_requested_at;
