import type pg from "pg";
import type { Row } from "../delegation/rows.js";
import type { Queryable } from "../tx.js";
import { wake } from "./rows.js";

/**
 * The orchestration journal's rows: a header in `workflow_journals.body` and one row per node in
 * `workflow_journal_nodes` (what a header and a node's row hold is the workflow engine's layout).
 */

/** A node's row as read: its id, its index in the journal's `order` (null when not in it) and its body. */
export interface WorkflowJournalNodeRow {
  readonly id: string;
  readonly position: number | null;
  readonly body: unknown;
}

/** A node's row to write, its body serialized already. */
export interface WorkflowJournalNodeText {
  readonly id: string;
  readonly position: number | null;
  readonly body: string;
}

/** One journal write, serialized: the whole header and the rows of the nodes that changed. */
export interface WorkflowJournalWrite {
  readonly header: string;
  readonly nodes: readonly WorkflowJournalNodeText[];
}

/** A stored journal: its header with its node rows, or (`nodes` null) the whole document of before. */
export interface StoredWorkflowJournal {
  readonly body: unknown;
  readonly nodes: WorkflowJournalNodeRow[] | null;
}

function storedJournalOf(r: Row): StoredWorkflowJournal {
  if (r.nodes === null || r.nodes === undefined) return { body: r.body, nodes: null };
  const nodes = (r.nodes as [string, number | null, unknown][]).map(
    ([id, position, body]): WorkflowJournalNodeRow => ({ id, position, body }),
  );
  return { body: r.body, nodes };
}

/** Node rows as one JSON array of [id, position, body] (each body is JSON text already). */
function nodeRowsText(nodes: readonly WorkflowJournalNodeText[]): string {
  return `[${nodes.map((n) => `[${JSON.stringify(n.id)},${n.position === null ? "null" : n.position},${n.body}]`).join(",")}]`;
}

/** The journals of several workflows in one read; a workflow without one is absent from the map. */
export async function readWorkflowJournals(
  pool: pg.Pool,
  workflowIds: readonly string[],
): Promise<Map<string, StoredWorkflowJournal>> {
  if (workflowIds.length === 0) return new Map();
  const { rows } = await pool.query<Row>(
    `select j.workflow_id, j.body,
              case when j.node_rows then coalesce(
                (select jsonb_agg(jsonb_build_array(n.node_id, n.position, n.body) order by n.position)
                   from workflow_journal_nodes n where n.workflow_id = j.workflow_id), '[]') end as nodes
         from workflow_journals j where j.workflow_id = any($1::uuid[])`,
    [workflowIds],
  );
  return new Map(rows.map((r) => [String(r.workflow_id), storedJournalOf(r)]));
}

/**
 * One journal write in one statement: the header and the rows of the nodes it names, all or nothing,
 * fenced by the lease and the generation (a superseded engine writes nothing). Also answers whether a
 * Stop was recorded for the workflow meanwhile.
 */
export async function writeWorkflowJournal(
  q: Queryable,
  workflowId: string,
  write: WorkflowJournalWrite,
  fence: { generation: number; owner: string },
): Promise<{ written: boolean; cancelRequested: boolean }> {
  const { rows } = await q.query<Row>(
    `with w as (select id, cancel_requested_at from workflows
                   where id = $1::uuid and generation = $3 and locked_by = $4),
            head as (insert into workflow_journals (workflow_id, body, node_rows)
                     select id, $2::jsonb, true from w
                     on conflict (workflow_id) do update set body = excluded.body, node_rows = true,
                            revision = workflow_journals.revision + 1, updated_at = now()
                     returning workflow_id),
            nodes as (insert into workflow_journal_nodes (workflow_id, node_id, position, body)
                      select w.id, e ->> 0, (e ->> 1)::int, e -> 2 from w, jsonb_array_elements($5::jsonb) e
                      on conflict (workflow_id, node_id) do update
                        set position = excluded.position, body = excluded.body
                      returning 1),
            woke as (select ${wake(workflowId, "workflow_id")} from head)
       select (select count(*) from head)::int as written, (select count(*) from woke)::int as woke,
              (select count(*) from nodes)::int as nodes,
              coalesce((select cancel_requested_at is not null from w), false) as cancel`,
    [workflowId, write.header, fence.generation, fence.owner, nodeRowsText(write.nodes)],
  );
  return { written: rows[0]?.written === 1, cancelRequested: rows[0]?.cancel === true };
}
