-- Up Migration
-- A workflow delivers one whole-workflow summary per tool call, however often its completion is emitted.
create unique index delegation_results_summary_once on delegation_results (parent_session_id, tool_call_id)
  where kind = 'workflow_summary';

-- Down Migration
drop index delegation_results_summary_once;
