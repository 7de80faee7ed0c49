-- Up Migration
-- A fork child's inherited prefix: the rows copied from its parent are seq 1..inherited_through (set when
-- the copy commits; null for sessions that inherited nothing or were forked before this migration).
-- A terminal memory-dreaming child's inherited prefix may be reclaimed once its call is closed and its
-- result delivered; the marker and the costs of that reclamation stay on the session row. Additive.
alter table sessions add column inherited_through bigint check (inherited_through is null or inherited_through >= 0);
alter table sessions add column prefix_reclaimed_at timestamptz;
alter table sessions add column prefix_reclaimed_rows bigint not null default 0 check (prefix_reclaimed_rows >= 0);
alter table sessions add column prefix_reclaimed_bytes bigint not null default 0 check (prefix_reclaimed_bytes >= 0);

-- Down Migration
alter table sessions drop column prefix_reclaimed_bytes;
alter table sessions drop column prefix_reclaimed_rows;
alter table sessions drop column prefix_reclaimed_at;
alter table sessions drop column inherited_through;
