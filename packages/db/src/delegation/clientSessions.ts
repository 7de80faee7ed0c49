import type pg from "pg";
import { DelegationDbError } from "../errors.js";
import type { ChildView, SessionRow, TakenResult } from "../repositories/delegation.js";
import { assertUuid, notFound, type Row, resultFromRow, runFromRow, sessionFromRow } from "./rows.js";

/**
 * The client-driven root session of this account named `name`, made on first use. Concurrent opens of one
 * name meet on the unique index: one inserts, the others read the row it made.
 */
export async function openClientSession(
  pool: pg.Pool,
  principalAccountId: string,
  name: string,
  model: string,
  scope?: string,
): Promise<{ session: SessionRow; created: boolean }> {
  assertUuid("principalAccountId", principalAccountId);
  if (name.length < 1 || name.length > 512)
    throw new DelegationDbError("invalid_input", "a session name is 1..512 characters", {});
  try {
    const ins = await pool.query<Row>(
      `insert into sessions (kind, principal_account_id, model, scope, driver, name)
       values ('root', $1::uuid, $2, $3, 'client', $4)
       on conflict (principal_account_id, name) where name is not null do nothing returning *`,
      [principalAccountId, model, scope ?? null, name],
    );
    if (ins.rows[0]) return { session: sessionFromRow(ins.rows[0]), created: true };
  } catch (e) {
    const code = (e as { code?: string }).code;
    if (code === "23503") throw notFound("account", { principalAccountId });
    if (code === "23514") throw new DelegationDbError("invalid_input", "model must be 1..200 characters", {});
    throw e;
  }
  const { rows } = await pool.query<Row>(
    `select * from sessions where principal_account_id = $1::uuid and name = $2 and visibility = 'visible'`,
    [principalAccountId, name],
  );
  if (!rows[0]) throw notFound("session", { name });
  return { session: sessionFromRow(rows[0]), created: false };
}

/** Results already delivered into the session's journal at or after `since`, oldest first. */
export async function takenResults(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  since: Date,
  limit = 100,
): Promise<TakenResult[]> {
  assertUuid("sessionId", sessionId);
  const { rows } = await pool.query<Row>(
    `select r.id, r.queue_seq, r.parent_session_id, r.child_session_id, r.run_id, r.tool_call_id, r.kind,
            r.outcome, r.mode, r.body, r.byte_size, s.path as spill_path, a.journal_seq, a.acknowledged_at
       from delegation_result_acks a
       join delegation_results r on r.id = a.result_id
       left join spilled_outputs s on s.id = r.spill_id
      where a.parent_session_id = $1::uuid and r.principal_account_id = $2::uuid and a.acknowledged_at >= $3
      order by a.journal_seq limit $4`,
    [sessionId, principalAccountId, since, limit],
  );
  return rows.map((r) => ({
    ...resultFromRow(r),
    journalSeq: Number(r.journal_seq),
    takenAt: r.acknowledged_at as Date,
  }));
}

/** Every child this session delegated to, each with its newest call, oldest child first. */
export async function childrenOf(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  limit = 200,
): Promise<ChildView[]> {
  assertUuid("sessionId", sessionId);
  const children = await pool.query<Row>(
    `select * from sessions
      where parent_session_id = $1::uuid and principal_account_id = $2::uuid and visibility = 'visible'
      order by created_at limit $3`,
    [sessionId, principalAccountId, limit],
  );
  const runs = await pool.query<Row>(
    `select distinct on (child_session_id) * from subagent_runs
      where parent_session_id = $1::uuid and principal_account_id = $2::uuid and child_session_id = any($3::uuid[])
      order by child_session_id, created_at desc`,
    [sessionId, principalAccountId, children.rows.map((r) => r.id)],
  );
  const latest = new Map(runs.rows.map((r) => [String(r.child_session_id), runFromRow(r)]));
  return children.rows.flatMap((r) => {
    const run = latest.get(String(r.id));
    return run ? [{ child: sessionFromRow(r), latestRun: run }] : [];
  });
}
