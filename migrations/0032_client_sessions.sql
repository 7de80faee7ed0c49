-- Up Migration
-- A root session a client drives itself (an MCP client such as Codex or Claude Code): crw starts no model
-- turn of its own for it, so results delivered to it wait until the client takes them. A name lets a
-- restarted client find its session, and the results it has not taken, again.
alter table sessions
  add column driver text not null default 'model' check (driver in ('model', 'client')),
  add column name text check (name is null or length(name) between 1 and 512);
alter table sessions add constraint sessions_client_root check (driver = 'model' or kind = 'root');
alter table sessions add constraint sessions_named_root check (name is null or kind = 'root');
create unique index sessions_name_once on sessions (principal_account_id, name) where name is not null;

-- Down Migration
drop index sessions_name_once;
alter table sessions drop constraint sessions_named_root;
alter table sessions drop constraint sessions_client_root;
alter table sessions drop column name, drop column driver;
