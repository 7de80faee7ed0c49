-- Up Migration
-- What a parent still has queued, read without walking its history. A result's acknowledgement stays its
-- row in delegation_result_acks (whose key makes a delivery once); `acknowledged` mirrors it on the result,
-- set by the statement that writes that row, so a parent's queue is read through a partial index of the
-- results not yet acknowledged, whatever number it has had delivered. The same for a parent's open runs.
alter table delegation_results add column acknowledged boolean not null default false;
update delegation_results r set acknowledged = true
 where exists (select 1 from delegation_result_acks a where a.result_id = r.id);
create index delegation_results_queued_idx on delegation_results (parent_session_id, queue_seq)
  where not acknowledged;
create index subagent_runs_open_parent_idx on subagent_runs (parent_session_id)
  where status in ('queued', 'running', 'settling');

-- Down Migration
drop index subagent_runs_open_parent_idx;
drop index delegation_results_queued_idx;
alter table delegation_results drop column acknowledged;
