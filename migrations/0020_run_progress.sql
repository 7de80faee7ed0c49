-- Up Migration
-- The newest published progress snapshot of an open call (canonical JSON), written by its owning job in
-- publication order. Progress writes touch only this column: the host-owned read_only_scope, the status
-- and the generation are never changed by a progress update. Additive and nullable: existing calls keep
-- null until they publish.
alter table subagent_runs add column progress text;
alter table subagent_runs add column progress_seq integer not null default 0 check (progress_seq >= 0);

-- Down Migration
alter table subagent_runs drop column progress_seq;
alter table subagent_runs drop column progress;
