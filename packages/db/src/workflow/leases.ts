import type pg from "pg";
import { lockKey, OWNER_LOCK_CLASS } from "../delegation/recovery.js";
import type { Row } from "../delegation/rows.js";
import { type ChannelListener, listenWhileConnected } from "../listen.js";
import { tx } from "../tx.js";
import { type WorkflowRow, workflowFromRow } from "./rows.js";

// Who drives a workflow: its row lease, the claims of recovery and a Stop recorded for its owner.

/** The owner lease's advisory lock (see recovery.ts): a lease whose owner holds no lock belongs to the dead. */
const ownerDead = (column: string) => `not exists (
  select 1 from pg_locks l
   where l.locktype = 'advisory' and l.granted and l.classid = ${OWNER_LOCK_CLASS}::oid
     and l.objid = ${lockKey(column)} and l.objsubid = 2)`;

/**
 * Boot: takes the lease of workflows left by a dead owner (running, or terminal with an undelivered
 * summary), oldest first, skipping rows another live process is claiming right now. `deadOwnersOnly` (a
 * live takeover): an unleased row or this owner's own is not taken, only a dead owner's.
 */
export function claimInterruptedWorkflows(
  pool: pg.Pool,
  owner: string,
  limit: number,
  options: { deadOwnersOnly?: boolean } = {},
): Promise<WorkflowRow[]> {
  return tx(pool, async (c) => {
    const { rows } = await c.query<Row>(
      `with orphaned as (
           select w.id from workflows w
            where (w.status = 'running'
                   or (w.summary_result_id is null and exists (select 1 from workflow_journals j where j.workflow_id = w.id)))
              and ((not $3::boolean and (w.locked_by is null or w.locked_by = $1))
                   or (w.locked_by is not null and w.locked_by <> $1 and ${ownerDead("w.locked_by")}))
            order by w.created_at
            for update of w skip locked
            limit $2)
         update workflows w set locked_by = $1, locked_at = now()
           from orphaned where w.id = orphaned.id
         returning w.*`,
      [owner, limit, options.deadOwnersOnly === true],
    );
    return rows.map(workflowFromRow).sort((a, b) => a.id.localeCompare(b.id));
  });
}

/** Announced (payload: the workflow id) when a Stop is recorded, for the process that drives the workflow. */
export const WORKFLOW_CANCEL_CHANNEL = "crw_workflow_cancel";

/**
 * A Stop for a workflow another process drives: recorded on the row and announced to its owner
 * (WORKFLOW_CANCEL_CHANNEL). False when the workflow is not running (or not this account's).
 */
export function requestWorkflowCancel(
  pool: pg.Pool,
  workflowId: string,
  principalAccountId: string,
): Promise<boolean> {
  return tx(pool, async (c) => {
    const { rowCount } = await c.query(
      `update workflows set cancel_requested_at = coalesce(cancel_requested_at, now()), updated_at = now()
          where id = $1::uuid and principal_account_id = $2::uuid and status = 'running'`,
      [workflowId, principalAccountId],
    );
    if (rowCount !== 1) return false;
    await c.query(`select pg_notify('${WORKFLOW_CANCEL_CHANNEL}', $1)`, [workflowId]);
    return true;
  });
}

/**
 * Hears the Stops recorded for workflows (each one's id) on a connection of its own. Not reopened when
 * lost: a driving engine also reads the Stop at its workflow's next journal write.
 */
export function listenForWorkflowCancels(
  pool: pg.Pool,
  onCancel: (workflowId: string) => void,
): Promise<ChannelListener> {
  return listenWhileConnected(pool, WORKFLOW_CANCEL_CHANNEL, onCancel);
}

/** Whether a Stop was recorded for the workflow (read by its owner at each journal write and at boot). */
export async function workflowCancelRequested(pool: pg.Pool, workflowId: string): Promise<boolean> {
  const { rows } = await pool.query<Row>(
    "select cancel_requested_at is not null as requested from workflows where id = $1::uuid",
    [workflowId],
  );
  return rows[0]?.requested === true;
}

export async function releaseWorkflow(pool: pg.Pool, workflowId: string, owner: string): Promise<void> {
  await pool.query(
    "update workflows set locked_by = null, locked_at = null where id = $1::uuid and locked_by = $2",
    [workflowId, owner],
  );
}

/**
 * A live takeover that could not resume what it claimed hands it back: the lease then names an owner
 * nobody holds, so the next sweep (of any process) claims it again.
 */
export async function handBackWorkflow(pool: pg.Pool, workflowId: string, owner: string): Promise<void> {
  await pool.query(
    "update workflows set locked_by = $2 || ':handed-back', locked_at = now() where id = $1::uuid and locked_by = $2",
    [workflowId, owner],
  );
}
