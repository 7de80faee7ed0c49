-- Up Migration
-- The installation's identity: one row, made by the first migration, read by every daemon that shares
-- this database so that they can tell they belong to the same deployment.
create table installation (
  singleton boolean primary key default true check (singleton),
  id uuid not null default gen_random_uuid(),
  created_at timestamptz not null default now()
);
insert into installation default values;

-- Down Migration
drop table installation;
