-- Up Migration
-- A continuation after an interruption that left no effect of unknown outcome (the child was waiting on its
-- model, or its tool calls had all answered) is not charged as a recovery attempt: it is counted here, so a
-- child interrupted over and over still ends.
alter table subagent_runs
  add column free_continuations integer not null default 0 check (free_continuations >= 0);

-- Down Migration
alter table subagent_runs drop column free_continuations;
