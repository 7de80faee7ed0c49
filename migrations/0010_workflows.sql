-- Up Migration
-- The workflow DAG engine. `workflows` is the host's native record of one WorkflowStart call: its
-- publication generation and recovery admission version (the fence every snapshot write names), the last
-- published progress snapshot, and the engine's ownership lease. `workflow_journals` holds the engine's
-- orchestration journal (a versioned JSON document, version 2 today); it remains until terminal
-- publication has settled. `workflow_artifacts` are shared node results addressed by content hash, and
-- `workflow_artifact_grants` say who may read each one (the parent and authorized direct dependents).

create table workflows (
  id uuid primary key default gen_random_uuid(),
  parent_session_id uuid not null,
  principal_account_id uuid not null,
  tool_call_id text not null check (length(tool_call_id) between 1 and 200),
  name text not null check (length(name) between 1 and 200),
  -- advanced only by an explicit WorkflowResume (terminal -> running); a write naming an older one is stale
  generation integer not null default 1 check (generation > 0),
  -- bumped when a held node is re-admitted after a repark; never invents a new generation
  recovery_admission_version integer not null default 1 check (recovery_admission_version > 0),
  status text not null default 'running'
    check (status in ('running', 'completed', 'failed', 'cancelled', 'invalid')),
  snapshot jsonb not null default '{}'::jsonb,
  -- how many snapshots were accepted (fenced writes that returned created or updated)
  published_count integer not null default 0,
  -- the whole-workflow summary's id in delegation_results, once handed to the parent's inbox
  summary_result_id uuid,
  -- engine ownership, as a row lease: claimed with for update skip locked
  locked_by text,
  locked_at timestamptz,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  unique (parent_session_id, tool_call_id),
  foreign key (parent_session_id, principal_account_id) references sessions (id, principal_account_id)
);
create index workflows_open_idx on workflows (created_at) where status = 'running';

create table workflow_journals (
  workflow_id uuid primary key references workflows (id) on delete cascade,
  body jsonb not null,
  -- how many times the engine rewrote the document (a diagnostic, not a fence)
  revision bigint not null default 1,
  updated_at timestamptz not null default now()
);

create table workflow_artifacts (
  workflow_id uuid not null references workflows (id) on delete cascade,
  node_id text not null check (length(node_id) between 1 and 128),
  sha256 text not null check (sha256 ~ '^[0-9a-f]{64}$'),
  byte_size bigint not null check (byte_size >= 0),
  body text not null,
  created_at timestamptz not null default now(),
  primary key (workflow_id, node_id)
);

-- A grant names a recipient session and the exact artifact version (its hash) it may read.
create table workflow_artifact_grants (
  workflow_id uuid not null,
  node_id text not null,
  sha256 text not null,
  recipient_session_id uuid not null references sessions (id) on delete cascade,
  created_at timestamptz not null default now(),
  primary key (workflow_id, node_id, recipient_session_id),
  foreign key (workflow_id, node_id) references workflow_artifacts (workflow_id, node_id) on delete cascade
);
create index workflow_artifact_grants_recipient_idx on workflow_artifact_grants (recipient_session_id);

-- Down Migration
drop table workflow_artifact_grants;
drop table workflow_artifacts;
drop table workflow_journals;
drop table workflows;
