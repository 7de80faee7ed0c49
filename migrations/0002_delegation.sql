-- Up Migration
-- The delegation core: accounts and their grants, sessions (root or delegated) with their journals, one
-- subagent run per Delegate/DelegateContinue tool call, the results inbox with its acknowledgements, text
-- steers with their receipts, and spilled outputs. Every read in @crw/db is scoped by parent and principal;
-- the composite foreign keys below make a cross-account link impossible to store, not merely refused.

create table accounts (
  id uuid primary key default gen_random_uuid(),
  name text not null unique check (length(name) between 1 and 200),
  -- null: every tool the host offers; an empty array: no tool at all.
  tool_allow text[],
  tool_deny text[] not null default '{}',
  permission_settings jsonb not null default '{}'::jsonb,
  is_owner boolean not null default false,
  is_administrator boolean not null default false,
  created_at timestamptz not null default now()
);

create table account_api_tokens (
  token_hash bytea primary key check (length(token_hash) = 32),
  account_id uuid not null references accounts (id) on delete cascade,
  label text not null default '',
  created_at timestamptz not null default now(),
  revoked_at timestamptz
);
create index account_api_tokens_account_idx on account_api_tokens (account_id);

create table sessions (
  id uuid primary key default gen_random_uuid(),
  kind text not null check (kind in ('root', 'delegated')),
  parent_session_id uuid,
  principal_account_id uuid not null references accounts (id),
  model text not null check (length(model) between 1 and 200),
  -- canonical JSON of the child's DelegatedExecutionScope, captured once at creation
  scope text,
  -- a fork copy stays private until its copied context has committed; readers never see private sessions
  visibility text not null default 'visible' check (visibility in ('visible', 'private')),
  fork_of_session_id uuid references sessions (id),
  -- the next journal sequence number; taking it row-locks the session: one writer per journal
  next_seq bigint not null default 1,
  created_at timestamptz not null default now(),
  unique (id, principal_account_id),
  foreign key (parent_session_id, principal_account_id) references sessions (id, principal_account_id),
  check ((kind = 'root') = (parent_session_id is null)),
  check ((kind = 'root') = (scope is null))
);
create index sessions_parent_idx on sessions (parent_session_id, principal_account_id);
create index sessions_private_idx on sessions (created_at) where visibility = 'private';

create table journal_entries (
  session_id uuid not null references sessions (id) on delete cascade,
  seq bigint not null check (seq > 0),
  kind text not null check (kind in ('message', 'custom_message', 'compaction', 'tool_intent')),
  -- for kind message: user, assistant or toolResult
  role text check (role in ('user', 'assistant', 'toolResult')),
  -- the original JSON text, decoded and validated in TypeScript
  body text not null,
  -- details.resultId of a delivered result (a custom_message or a foreground Delegate's toolResult)
  result_id uuid,
  tool_call_id text,
  -- false for provisional rows of a turn still streaming; recovery settles or discards them
  settled boolean not null default true,
  discarded boolean not null default false,
  created_at timestamptz not null default now(),
  primary key (session_id, seq),
  check ((kind = 'message') = (role is not null)),
  check (kind <> 'tool_intent' or tool_call_id is not null)
);
-- The storage half of exactly-once delivery: one live journal entry per result in a session.
create unique index journal_entries_result_once on journal_entries (session_id, result_id)
  where result_id is not null and not discarded;
create index journal_entries_assistant_idx on journal_entries (session_id, seq desc)
  where role = 'assistant' and not discarded;
create index journal_entries_tool_call_idx on journal_entries (session_id, tool_call_id)
  where tool_call_id is not null;

-- One row per Delegate or DelegateContinue tool call.
-- status: queued (persisted, not yet dispatched) -> running -> settling -> succeeded | failed | aborted.
create table subagent_runs (
  id uuid primary key default gen_random_uuid(),
  parent_session_id uuid not null,
  principal_account_id uuid not null,
  tool_call_id text not null check (length(tool_call_id) between 1 and 200),
  -- null only when boot discarded an unfinished private fork copy: the missing-child path settles the call
  child_session_id uuid,
  kind text not null check (kind in ('delegate', 'continue')),
  mode text not null check (mode in ('foreground', 'background')),
  task text not null,
  status text not null default 'queued'
    check (status in ('queued', 'running', 'settling', 'succeeded', 'failed', 'aborted')),
  generation integer not null default 1 check (generation > 0),
  -- host-owned clamp of a continuation asked for from a read-only turn (canonical JSON); null: none
  read_only_scope text,
  recovery_attempts integer not null default 0 check (recovery_attempts >= 0),
  -- recovery ownership lease, as a row lease: taken with for update skip locked
  locked_by text,
  locked_at timestamptz,
  error jsonb,
  created_at timestamptz not null default now(),
  started_at timestamptz,
  settled_at timestamptz,
  updated_at timestamptz not null default now(),
  unique (parent_session_id, tool_call_id),
  foreign key (parent_session_id, principal_account_id) references sessions (id, principal_account_id),
  foreign key (child_session_id, principal_account_id) references sessions (id, principal_account_id)
    on delete set null (child_session_id),
  check (child_session_id <> parent_session_id)
);
-- At most one open call per child: a second caller waits or steers, it never runs a second turn beside it.
create unique index subagent_runs_one_open_per_child on subagent_runs (child_session_id)
  where status in ('queued', 'running', 'settling');
create index subagent_runs_open_idx on subagent_runs (created_at) where status in ('queued', 'running', 'settling');
create index subagent_runs_child_idx on subagent_runs (child_session_id, created_at desc);

create table spilled_outputs (
  id uuid primary key default gen_random_uuid(),
  session_id uuid not null,
  principal_account_id uuid not null,
  path text not null unique,
  byte_size bigint not null check (byte_size >= 0),
  sha256 text not null check (length(sha256) = 64),
  created_at timestamptz not null default now(),
  foreign key (session_id, principal_account_id) references sessions (id, principal_account_id)
);

-- The results inbox: a settled child result waiting for its parent. queue_seq orders delivery (FIFO).
create table delegation_results (
  id uuid primary key,
  queue_seq bigint generated always as identity unique,
  parent_session_id uuid not null,
  principal_account_id uuid not null,
  -- one result per run: settling twice is a no-op (on conflict do nothing)
  run_id uuid unique references subagent_runs (id),
  child_session_id uuid,
  tool_call_id text not null,
  kind text not null check (kind in ('subagent', 'workflow_summary')),
  outcome text not null check (outcome in ('ok', 'error')),
  mode text not null check (mode in ('foreground', 'background')),
  -- the inline body, or the bounded placeholder when the full body is in spilled_outputs
  body text not null,
  byte_size bigint not null check (byte_size >= 0),
  spill_id uuid references spilled_outputs (id),
  created_at timestamptz not null default now(),
  foreign key (parent_session_id, principal_account_id) references sessions (id, principal_account_id)
);
create index delegation_results_parent_idx on delegation_results (parent_session_id, queue_seq);

-- Written in the same transaction as the parent's journal entry that carries the result.
create table delegation_result_acks (
  result_id uuid primary key references delegation_results (id),
  parent_session_id uuid not null,
  journal_seq bigint not null,
  acknowledged_at timestamptz not null default now(),
  foreign key (parent_session_id, journal_seq) references journal_entries (session_id, seq)
);
create index delegation_result_acks_parent_idx on delegation_result_acks (parent_session_id);

-- Text follow-ups to a child, with their receipts (delivered into the child's journal, or dropped).
create table delegated_steers (
  id uuid primary key default gen_random_uuid(),
  child_session_id uuid not null,
  principal_account_id uuid not null,
  text text not null check (length(text) between 1 and 100000),
  status text not null default 'pending' check (status in ('pending', 'delivered', 'dropped')),
  journal_seq bigint,
  drop_reason text,
  created_at timestamptz not null default now(),
  resolved_at timestamptz,
  foreign key (child_session_id, principal_account_id) references sessions (id, principal_account_id),
  check ((status = 'delivered') = (journal_seq is not null))
);
create index delegated_steers_pending_idx on delegated_steers (child_session_id, created_at)
  where status = 'pending';

-- Down Migration
drop table delegated_steers;
drop table delegation_result_acks;
drop table delegation_results;
drop table spilled_outputs;
drop table subagent_runs;
drop table journal_entries;
drop table sessions;
drop table account_api_tokens;
drop table accounts;
