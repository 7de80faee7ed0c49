-- Up Migration
-- Working directories. A root session may now carry a scope too (its working directory and the project it is
-- placed in, captured at creation), not only a delegated child; a child still always has one.
do $$
declare c text;
begin
  select conname into strict c from pg_constraint
   where conrelid = 'sessions'::regclass and contype = 'c' and pg_get_constraintdef(oid) like '%scope IS NULL%';
  execute format('alter table sessions drop constraint %I', c);
end $$;
alter table sessions add constraint sessions_delegated_scope check (kind = 'root' or scope is not null);

-- Registered projects: a directory on this host under a name. The owner and administrators may work in any
-- directory; every other account only inside the projects granted to it.
create table projects (
  ref text primary key check (ref ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
  root text not null unique check (root ~ '^/' and length(root) <= 4096),
  created_at timestamptz not null default now()
);

create table project_grants (
  project_ref text not null references projects (ref) on delete cascade,
  account_id uuid not null references accounts (id) on delete cascade,
  created_at timestamptz not null default now(),
  primary key (project_ref, account_id)
);
create index project_grants_account_idx on project_grants (account_id);

-- An isolated child's own git worktree, on a branch of its own, made from its parent's HEAD before the
-- child exists (the row is written with the child, in one transaction). crw commits what the child leaves
-- (committed_commit) and lands it into the branch the work started from (landed_commit), never by force.
create table isolated_worktrees (
  session_id uuid primary key,
  principal_account_id uuid not null,
  repo_root text not null,
  path text not null unique,
  branch text not null,
  base_commit text not null check (base_commit ~ '^[0-9a-f]{40,64}$'),
  started_from_branch text,
  committed_commit text check (committed_commit ~ '^[0-9a-f]{40,64}$'),
  landed_commit text check (landed_commit ~ '^[0-9a-f]{40,64}$'),
  -- a workflow node's child: its workflow and node (the workflow's journal is gone once it completes)
  workflow_id uuid,
  node_id text check (node_id is null or length(node_id) between 1 and 128),
  created_at timestamptz not null default now(),
  foreign key (session_id, principal_account_id) references sessions (id, principal_account_id) on delete cascade,
  check ((workflow_id is null) = (node_id is null))
);
create index isolated_worktrees_workflow_idx on isolated_worktrees (workflow_id) where workflow_id is not null;

-- Down Migration
drop table isolated_worktrees;
drop table project_grants;
drop table projects;
alter table sessions drop constraint sessions_delegated_scope;
alter table sessions add constraint sessions_check1 check ((kind = 'root') = (scope is null));
