-- Up Migration
-- The orchestration journal in rows: `workflow_journals.body` becomes the journal's header (everything but
-- its nodes), and each node's part lives in a row of its own: its state, its entries of the per-node maps
-- (`nodeAccess`, `nodeModels`, `nodeWorktrees`) and its place in `order`. A write then upserts only the
-- nodes that changed, so its size no longer grows with the workflow. `node_rows` says which layout a
-- journal is in: false is the whole document of before (read as it is), true a header over its node rows.
-- Every journal with a node map and an order of distinct node ids is carried over; anything else (an old
-- format, a malformed document) stays whole and is refused on reading as before.

alter table workflow_journals add column node_rows boolean not null default false;

create table workflow_journal_nodes (
  workflow_id uuid not null references workflow_journals (workflow_id) on delete cascade,
  node_id text not null,
  -- the node's index in the journal's `order`; null for a node that is not in it
  position integer check (position >= 0),
  -- {state?, access?, model?, worktree?}: the node's entry in `nodes` and in each per-node map
  body jsonb not null,
  primary key (workflow_id, node_id)
);

-- {key: value}, or nothing when the value is absent.
create function pg_temp.entry(key text, value jsonb) returns jsonb language sql immutable
  as $$ select case when value is null then '{}'::jsonb else jsonb_build_object(key, value) end $$;

create temporary table journal_layout on commit drop as
  select j.workflow_id, j.body,
         array(select k from jsonb_object_keys(j.body -> 'nodes') k
               union select o from jsonb_array_elements_text(j.body -> 'order') o) as ids
    from workflow_journals j
   where jsonb_typeof(j.body -> 'nodes') = 'object'
     and jsonb_typeof(j.body -> 'order') = 'array'
     and not exists (select 1 from jsonb_array_elements(j.body -> 'order') e where jsonb_typeof(e) <> 'string')
     and (select count(distinct o) = count(*) from jsonb_array_elements_text(j.body -> 'order') o)
     and coalesce(jsonb_typeof(j.body -> 'nodeAccess'), 'object') = 'object'
     and coalesce(jsonb_typeof(j.body -> 'nodeModels'), 'object') = 'object'
     and coalesce(jsonb_typeof(j.body -> 'nodeWorktrees'), 'object') = 'object';

insert into workflow_journal_nodes (workflow_id, node_id, position, body)
select l.workflow_id, id,
       (select o.i - 1 from jsonb_array_elements_text(l.body -> 'order') with ordinality o (v, i) where o.v = id),
       pg_temp.entry('state', l.body -> 'nodes' -> id)
       || pg_temp.entry('access', l.body -> 'nodeAccess' -> id)
       || pg_temp.entry('model', l.body -> 'nodeModels' -> id)
       || pg_temp.entry('worktree', l.body -> 'nodeWorktrees' -> id)
  from journal_layout l, unnest(l.ids) id;

-- The header keeps each per-node map as present or absent, with any entry that names no node.
update workflow_journals j
   set node_rows = true,
       body = l.body - 'nodes' - 'order'
              || pg_temp.entry('nodeAccess', (l.body -> 'nodeAccess') - l.ids)
              || pg_temp.entry('nodeModels', (l.body -> 'nodeModels') - l.ids)
              || pg_temp.entry('nodeWorktrees', (l.body -> 'nodeWorktrees') - l.ids)
  from journal_layout l
 where j.workflow_id = l.workflow_id;

-- Down Migration
create function pg_temp.entry(key text, value jsonb) returns jsonb language sql immutable
  as $$ select case when value is null then '{}'::jsonb else jsonb_build_object(key, value) end $$;
-- A node map of the header with the nodes' entries of `field` put back.
create function pg_temp.node_map(workflow uuid, map jsonb, field text) returns jsonb language sql stable
  as $$ select map || coalesce((select jsonb_object_agg(n.node_id, n.body -> field) from workflow_journal_nodes n
                                where n.workflow_id = workflow and n.body ? field), '{}') $$;

update workflow_journals j
   set body = j.body
              || jsonb_build_object(
                   'order', coalesce((select jsonb_agg(n.node_id order by n.position) from workflow_journal_nodes n
                                       where n.workflow_id = j.workflow_id and n.position is not null), '[]'),
                   'nodes', coalesce((select jsonb_object_agg(n.node_id, n.body -> 'state') from workflow_journal_nodes n
                                       where n.workflow_id = j.workflow_id and n.body ? 'state'), '{}'))
              || pg_temp.entry('nodeAccess', pg_temp.node_map(j.workflow_id, j.body -> 'nodeAccess', 'access'))
              || pg_temp.entry('nodeModels', pg_temp.node_map(j.workflow_id, j.body -> 'nodeModels', 'model'))
              || pg_temp.entry('nodeWorktrees', pg_temp.node_map(j.workflow_id, j.body -> 'nodeWorktrees', 'worktree'))
 where j.node_rows;
drop table workflow_journal_nodes;
alter table workflow_journals drop column node_rows;
