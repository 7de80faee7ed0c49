-- Up Migration
-- A session's spilled outputs are looked up on every turn (whether it is offered Read) and by Read itself.
create index spilled_outputs_session_idx on spilled_outputs (session_id, principal_account_id);

-- Down Migration
drop index spilled_outputs_session_idx;
