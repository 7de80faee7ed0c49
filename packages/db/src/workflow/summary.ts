import type pg from "pg";
import type { Row } from "../delegation/rows.js";
import { tx } from "../tx.js";
import { wake } from "./rows.js";

export interface WorkflowSummaryHandoff {
  readonly workflowId: string;
  readonly generation: number;
  readonly resultId: string;
  readonly outcome: "ok" | "error";
  readonly body: string;
  /** The tool call the summary answers; the starting call when absent. */
  readonly toolCallId?: string;
  /** The full summary's size when `body` is a spill placeholder, and the spill's record. */
  readonly byteSize?: number;
  readonly spillId?: string;
  readonly keepJournal?: boolean;
}

/**
 * The whole-workflow summary into the parent's results inbox, exactly once (its id is fixed in the
 * journal; the id of the summary already there for this tool call otherwise), and the journal's removal,
 * in one transaction, after terminal publication has settled. Null while the workflow of that generation
 * is running (or when there is none). The delegation core then delivers it like any result.
 */
export function deliverWorkflowSummary(pool: pg.Pool, input: WorkflowSummaryHandoff): Promise<string | null> {
  return tx(pool, async (c) => {
    const { rows } = await c.query<Row>(
      "select * from workflows where id = $1::uuid and generation = $2 for update",
      [input.workflowId, input.generation],
    );
    const w = rows[0];
    if (!w || w.status === "running") return null;
    const toolCallId = input.toolCallId ?? String(w.tool_call_id);
    // One summary per tool call (the delegation core's constraint): a repeat adds nothing.
    const inserted = await c.query<Row>(
      `insert into delegation_results (id, parent_session_id, principal_account_id, tool_call_id, kind, outcome,
                                         mode, body, byte_size, spill_id)
         values ($1::uuid, $2::uuid, $3::uuid, $4, 'workflow_summary', $5, 'background', $6, $7, $8::uuid)
         on conflict do nothing returning id`,
      [
        input.resultId,
        w.parent_session_id,
        w.principal_account_id,
        toolCallId,
        input.outcome,
        input.body,
        input.byteSize ?? Buffer.byteLength(input.body),
        input.spillId ?? null,
      ],
    );
    const resultId = inserted.rows[0]
      ? input.resultId
      : await existingSummary(c, w, toolCallId, input.resultId);
    await c.query(
      `update workflows set summary_result_id = $2::uuid, updated_at = now() where id = $1::uuid
         returning ${wake(input.workflowId)}`,
      [input.workflowId, resultId],
    );
    if (!input.keepJournal)
      await c.query("delete from workflow_journals where workflow_id = $1::uuid", [input.workflowId]);
    return resultId;
  });
}

/** The id of the summary already delivered for this tool call (`fallback` when none is found). */
async function existingSummary(
  c: pg.PoolClient,
  w: Row,
  toolCallId: string,
  fallback: string,
): Promise<string> {
  const existing = await c.query<Row>(
    `select id from delegation_results
            where parent_session_id = $1::uuid and tool_call_id = $2 and kind = 'workflow_summary'`,
    [w.parent_session_id, toolCallId],
  );
  return existing.rows[0] ? String(existing.rows[0].id) : fallback;
}
