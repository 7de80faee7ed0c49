-- Up Migration
-- Provider usage of delegated turns, one row per provider response, as the runner that ran the turn reported
-- it to the daemon. Accounting only: nothing reads it to decide execution. A session's rows go with it.
create table provider_usage (
  id bigserial primary key,
  session_id uuid not null references sessions (id) on delete cascade,
  turn_id text not null check (length(turn_id) between 1 and 128),
  runner_id text not null check (length(runner_id) between 1 and 128),
  api text not null check (length(api) between 1 and 128),
  provider text not null check (length(provider) between 1 and 128),
  model text not null check (length(model) between 1 and 256),
  stop_reason text not null check (length(stop_reason) between 1 and 64),
  input_tokens bigint not null check (input_tokens >= 0),
  output_tokens bigint not null check (output_tokens >= 0),
  cache_read_tokens bigint not null check (cache_read_tokens >= 0),
  cache_write_tokens bigint not null check (cache_write_tokens >= 0),
  total_tokens bigint not null check (total_tokens >= 0),
  cost double precision not null check (cost >= 0),
  recorded_at timestamptz not null default now()
);
create index provider_usage_session on provider_usage (session_id, id);

-- Down Migration
drop table provider_usage;
