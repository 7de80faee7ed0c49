import type pg from "pg";
import type { Row } from "../delegation/rows.js";
import {
  type NewWorkflow,
  recoveryFromRow,
  type WorkflowRecovery,
  type WorkflowRow,
  type WorkflowStatus,
  wake,
  workflowFromRow,
} from "./rows.js";

// The native workflow record: its insert, its reads and its fenced status writes.

/** Several workflows in one read, keyed by their id as PostgreSQL prints it; a missing one is absent. */
export async function workflowsByIds(
  pool: pg.Pool,
  ids: readonly string[],
): Promise<Map<string, WorkflowRow>> {
  const { rows } = await pool.query<Row>("select * from workflows where id = any($1::uuid[])", [ids]);
  return new Map(rows.map((r) => [String(r.id), workflowFromRow(r)]));
}

/** The initial native insert (idempotent per parent tool call); the caller owns the new row's lease. */
export async function insertWorkflow(
  pool: pg.Pool,
  input: NewWorkflow,
): Promise<{ id: string; inserted: boolean }> {
  const { rows } = await pool.query<Row>(
    `insert into workflows (id, parent_session_id, principal_account_id, tool_call_id, name, snapshot,
                              published_count, locked_by, locked_at)
       values ($7::uuid, $1::uuid, $2::uuid, $3, $4, $5::jsonb, 1, $6, now())
       on conflict (parent_session_id, tool_call_id) do nothing
       returning id`,
    [
      input.parentSessionId,
      input.principalAccountId,
      input.toolCallId,
      input.name,
      JSON.stringify(input.snapshot),
      input.owner,
      input.id,
    ],
  );
  if (rows[0]) return { id: String(rows[0].id), inserted: true };
  const existing = await pool.query<Row>(
    "select id from workflows where parent_session_id = $1::uuid and tool_call_id = $2",
    [input.parentSessionId, input.toolCallId],
  );
  return { id: String(existing.rows[0]?.id), inserted: false };
}

/** The recovery proof of a workflow, read back from the native row. */
export async function recoverableWorkflow(
  pool: pg.Pool,
  workflowId: string,
): Promise<WorkflowRecovery | null> {
  const { rows } = await pool.query<Row>(
    "select generation, recovery_admission_version from workflows where id = $1::uuid",
    [workflowId],
  );
  return rows[0] ? recoveryFromRow(rows[0]) : null;
}

export async function getWorkflow(
  pool: pg.Pool,
  workflowId: string,
  principalAccountId?: string,
): Promise<WorkflowRow | null> {
  const { rows } = await pool.query<Row>(
    `select * from workflows where id = $1::uuid and ($2::uuid is null or principal_account_id = $2::uuid)`,
    [workflowId, principalAccountId ?? null],
  );
  return rows[0] ? workflowFromRow(rows[0]) : null;
}

/** The workflows a session started, oldest first. */
export async function workflowsOfSession(
  pool: pg.Pool,
  parentSessionId: string,
  principalAccountId: string,
  limit: number,
): Promise<WorkflowRow[]> {
  const { rows } = await pool.query<Row>(
    `select * from workflows where parent_session_id = $1::uuid and principal_account_id = $2::uuid
        order by created_at limit $3`,
    [parentSessionId, principalAccountId, limit],
  );
  return rows.map(workflowFromRow);
}

/**
 * A fenced snapshot write: accepted only under `expectedGeneration` and, when `owner` is given, only while
 * that owner holds the row's lease; never moving a terminal record back to running. `updated` includes
 * terminal updates; a refused write publishes nothing (`stale`).
 */
export async function publishWorkflowSnapshot(
  pool: pg.Pool,
  workflowId: string,
  publication: { snapshot: unknown; status: WorkflowStatus; expectedGeneration: number; owner?: string },
): Promise<"updated" | "stale"> {
  const { snapshot, status, expectedGeneration, owner } = publication;
  const { rowCount } = await pool.query(
    `update workflows set snapshot = $2::jsonb, status = $3, published_count = published_count + 1,
              updated_at = now()
        where id = $1::uuid and generation = $4 and status = 'running'
          and ($5::text is null or locked_by = $5::text)
        returning ${wake(workflowId)}`,
    [workflowId, JSON.stringify(snapshot), status, expectedGeneration, owner ?? null],
  );
  return rowCount === 1 ? "updated" : "stale";
}

/**
 * Explicit WorkflowResume's terminal-to-running bridge: a new generation (older writers become stale),
 * the same admission version, and the lease to the resuming process (a terminal row is driven by nobody;
 * a late writer of the old generation is fenced by the generation). Null when not terminal.
 */
export async function advanceWorkflowGeneration(
  pool: pg.Pool,
  input: { workflowId: string; toolCallId: string; principalAccountId: string; owner: string },
): Promise<WorkflowRecovery | null> {
  const { rows } = await pool.query<Row>(
    `update workflows set generation = generation + 1, status = 'running', summary_result_id = null,
              locked_by = $4, locked_at = now(), updated_at = now()
        where id = $1::uuid and tool_call_id = $2 and principal_account_id = $3::uuid
          and status in ('completed', 'failed', 'cancelled')
        returning generation, recovery_admission_version`,
    [input.workflowId, input.toolCallId, input.principalAccountId, input.owner],
  );
  return rows[0] ? recoveryFromRow(rows[0]) : null;
}

/** The invalid-journal path: only this workflow ends (status invalid), whatever its generation. */
export async function terminalizeInvalidWorkflow(pool: pg.Pool, workflowId: string): Promise<number | null> {
  const { rows } = await pool.query<Row>(
    `update workflows set status = 'invalid', updated_at = now() where id = $1::uuid and status <> 'invalid'
       returning generation, ${wake(workflowId)}`,
    [workflowId],
  );
  if (rows[0]) return Number(rows[0].generation);
  const again = await pool.query<Row>("select generation from workflows where id = $1::uuid", [workflowId]);
  return again.rows[0] ? Number(again.rows[0].generation) : null;
}
