import { type Queryable, tx, WORKFLOW_WAKE_CHANNEL, wakeWanted } from "@crw/db";
import type pg from "pg";
import type { OrchestrationJournal } from "../journal/schema.js";
import { TickBatchedReader } from "./batch.js";
import {
  assembleJournal,
  type JournalWrite,
  type NodeRow,
  type NodeRowText,
  wholeJournalWrite,
} from "./journalLayout.js";

/** The native record's recovery metadata (the host's proof; never inferred from the journal's run number). */
export interface WorkflowRecovery {
  readonly workflowGeneration: number;
  readonly recoveryAdmissionVersion: number;
}

export type WorkflowStatus = "running" | "completed" | "failed" | "cancelled" | "invalid";
export const TERMINAL_WORKFLOW_STATUSES: ReadonlySet<WorkflowStatus> = new Set([
  "completed",
  "failed",
  "cancelled",
  "invalid",
]);

/**
 * The workflow wake, in the statement of each write a follower shows (node states in the journal, the
 * snapshot and status, the summary handoff): sent at commit, so `workflow.follow` in any daemon re-reads
 * at once. Selected only from the changed row, so a refused (fenced) write wakes nobody; sent only when some
 * process watches the workflow (see `wakeWanted` in @crw/db: notifying commits are serialized).
 */
const wake = (workflowId: string, idColumn = "id") =>
  wakeWanted("workflow", workflowId)
    ? `pg_notify('${WORKFLOW_WAKE_CHANNEL}', ${idColumn}::text) as woke`
    : "null as woke";

export interface WorkflowRow {
  readonly id: string;
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly toolCallId: string;
  readonly name: string;
  readonly status: WorkflowStatus;
  readonly recovery: WorkflowRecovery;
  readonly snapshot: unknown;
  readonly publishedCount: number;
  readonly summaryResultId: string | null;
  readonly lockedBy: string | null;
  readonly cancelRequested: boolean;
}

type Row = Record<string, unknown>;

function workflowFromRow(r: Row): WorkflowRow {
  return {
    id: String(r.id),
    parentSessionId: String(r.parent_session_id),
    principalAccountId: String(r.principal_account_id),
    toolCallId: String(r.tool_call_id),
    name: String(r.name),
    status: r.status as WorkflowStatus,
    recovery: {
      workflowGeneration: Number(r.generation),
      recoveryAdmissionVersion: Number(r.recovery_admission_version),
    },
    snapshot: r.snapshot,
    publishedCount: Number(r.published_count),
    summaryResultId: r.summary_result_id === null ? null : String(r.summary_result_id),
    lockedBy: r.locked_by === null ? null : String(r.locked_by),
    cancelRequested: r.cancel_requested_at !== null && r.cancel_requested_at !== undefined,
  };
}

/** A journal row as read: the whole document of before, or a header assembled with its node rows. */
function journalOfRow(r: Row): unknown {
  if (r.nodes === null || r.nodes === undefined) return r.body;
  const rows = (r.nodes as [string, number | null, NodeRow["body"]][]).map(
    ([id, position, body]): NodeRow => ({ id, position, body }),
  );
  return assembleJournal(r.body, rows);
}

/** Node rows as one JSON array of [id, position, body] (each body is JSON text already). */
function nodeRowsText(nodes: readonly NodeRowText[]): string {
  return `[${nodes.map((n) => `[${JSON.stringify(n.id)},${n.position === null ? "null" : n.position},${n.body}]`).join(",")}]`;
}

/** Same advisory lock class as @crw/db's owner lease: a lease whose owner holds no lock belongs to the dead. */
const OWNER_LOCK_CLASS = 7305;
const ownerDead = (column: string) => `not exists (
  select 1 from pg_locks l
   where l.locktype = 'advisory' and l.granted and l.classid = ${OWNER_LOCK_CLASS}::oid
     and l.objid = (hashtext(${column})::bigint & 4294967295)::oid and l.objsubid = 2)`;

export interface NewWorkflow {
  readonly id: string;
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly toolCallId: string;
  readonly name: string;
  readonly snapshot: unknown;
  readonly owner: string;
}

/**
 * The host side of workflow persistence: the native record and its fenced publication, the engine's
 * ownership lease, the orchestration journal and the summary handoff into the parent's results inbox.
 */
export class PgWorkflowStore {
  readonly #rows = new TickBatchedReader<string, WorkflowRow>(async (ids) => {
    const { rows } = await this.pool.query<Row>("select * from workflows where id = any($1::uuid[])", [ids]);
    return new Map(rows.map((r) => [String(r.id), workflowFromRow(r)]));
  });

  constructor(readonly pool: pg.Pool) {}

  /**
   * getWorkflow for a fence check: read by a statement issued after this call, shared with the other
   * checks asked for in the same tick (see TickBatchedReader).
   */
  async currentWorkflow(workflowId: string): Promise<WorkflowRow | null> {
    // Keyed as PostgreSQL prints a uuid, whatever case the caller's text uses.
    return (await this.#rows.read(workflowId.toLowerCase())) ?? null;
  }

  /** The initial native insert (idempotent per parent tool call); the caller owns the new row's lease. */
  async insertWorkflow(input: NewWorkflow): Promise<{ id: string; inserted: boolean }> {
    const { rows } = await this.pool.query<Row>(
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
    const existing = await this.pool.query<Row>(
      "select id from workflows where parent_session_id = $1::uuid and tool_call_id = $2",
      [input.parentSessionId, input.toolCallId],
    );
    return { id: String(existing.rows[0]?.id), inserted: false };
  }

  /** The recovery proof of a workflow, read back from the native row (`recoverableWorkflow`). */
  async recoverableWorkflow(workflowId: string): Promise<WorkflowRecovery | null> {
    const { rows } = await this.pool.query<Row>(
      "select generation, recovery_admission_version from workflows where id = $1::uuid",
      [workflowId],
    );
    const r = rows[0];
    return r
      ? {
          workflowGeneration: Number(r.generation),
          recoveryAdmissionVersion: Number(r.recovery_admission_version),
        }
      : null;
  }

  async getWorkflow(workflowId: string, principalAccountId?: string): Promise<WorkflowRow | null> {
    const { rows } = await this.pool.query<Row>(
      `select * from workflows where id = $1::uuid and ($2::uuid is null or principal_account_id = $2::uuid)`,
      [workflowId, principalAccountId ?? null],
    );
    return rows[0] ? workflowFromRow(rows[0]) : null;
  }

  /** The workflows a session started, oldest first. */
  async workflowsOfSession(
    parentSessionId: string,
    principalAccountId: string,
    limit = 200,
  ): Promise<WorkflowRow[]> {
    const { rows } = await this.pool.query<Row>(
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
  async publishSnapshot(
    workflowId: string,
    snapshot: unknown,
    status: WorkflowStatus,
    expectedGeneration: number,
    owner?: string,
  ): Promise<"updated" | "stale"> {
    const { rowCount } = await this.pool.query(
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
  async advanceWorkflowGeneration(input: {
    workflowId: string;
    toolCallId: string;
    principalAccountId: string;
    owner: string;
  }): Promise<WorkflowRecovery | null> {
    const { rows } = await this.pool.query<Row>(
      `update workflows set generation = generation + 1, status = 'running', summary_result_id = null,
              locked_by = $4, locked_at = now(), updated_at = now()
        where id = $1::uuid and tool_call_id = $2 and principal_account_id = $3::uuid
          and status in ('completed', 'failed', 'cancelled')
        returning generation, recovery_admission_version`,
      [input.workflowId, input.toolCallId, input.principalAccountId, input.owner],
    );
    const r = rows[0];
    return r
      ? {
          workflowGeneration: Number(r.generation),
          recoveryAdmissionVersion: Number(r.recovery_admission_version),
        }
      : null;
  }

  /**
   * Boot: takes the lease of workflows left by a dead owner (running, or terminal with an undelivered
   * summary), oldest first, skipping rows another live process is claiming right now.
   */
  claimInterrupted(
    owner: string,
    limit: number,
    options: { deadOwnersOnly?: boolean } = {},
  ): Promise<WorkflowRow[]> {
    // deadOwnersOnly (a live takeover): an unleased row or this owner's own is not taken, only a dead owner's.
    return tx(this.pool, async (c) => {
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

  /**
   * A Stop for a workflow another process drives: recorded on the row and announced to its owner (channel
   * crw_workflow_cancel). False when the workflow is not running (or not this account's).
   */
  async requestCancel(workflowId: string, principalAccountId: string): Promise<boolean> {
    return tx(this.pool, async (c) => {
      const { rowCount } = await c.query(
        `update workflows set cancel_requested_at = coalesce(cancel_requested_at, now()), updated_at = now()
          where id = $1::uuid and principal_account_id = $2::uuid and status = 'running'`,
        [workflowId, principalAccountId],
      );
      if (rowCount !== 1) return false;
      await c.query("select pg_notify('crw_workflow_cancel', $1)", [workflowId]);
      return true;
    });
  }

  /** Whether a Stop was recorded for the workflow (read by its owner at each journal write and at boot). */
  async cancelRequested(workflowId: string): Promise<boolean> {
    const { rows } = await this.pool.query<Row>(
      "select cancel_requested_at is not null as requested from workflows where id = $1::uuid",
      [workflowId],
    );
    return rows[0]?.requested === true;
  }

  async releaseWorkflow(workflowId: string, owner: string): Promise<void> {
    await this.pool.query(
      "update workflows set locked_by = null, locked_at = null where id = $1::uuid and locked_by = $2",
      [workflowId, owner],
    );
  }

  /**
   * A live takeover that could not resume what it claimed hands it back: the lease then names an owner
   * nobody holds, so the next sweep (of any process) claims it again.
   */
  async handBackWorkflow(workflowId: string, owner: string): Promise<void> {
    await this.pool.query(
      "update workflows set locked_by = $2 || ':handed-back', locked_at = now() where id = $1::uuid and locked_by = $2",
      [workflowId, owner],
    );
  }

  /** The workflow's journal, assembled from its header and node rows (null when it has none). */
  async readJournal(workflowId: string): Promise<unknown | null> {
    return (await this.readJournals([workflowId])).get(workflowId.toLowerCase()) ?? null;
  }

  /** The journals of several workflows in one read; a workflow without one is absent from the map. */
  async readJournals(workflowIds: readonly string[]): Promise<Map<string, unknown>> {
    if (workflowIds.length === 0) return new Map();
    const { rows } = await this.pool.query<Row>(
      `select j.workflow_id, j.body,
              case when j.node_rows then coalesce(
                (select jsonb_agg(jsonb_build_array(n.node_id, n.position, n.body) order by n.position)
                   from workflow_journal_nodes n where n.workflow_id = j.workflow_id), '[]') end as nodes
         from workflow_journals j where j.workflow_id = any($1::uuid[])`,
      [workflowIds],
    );
    return new Map(rows.map((r) => [String(r.workflow_id), journalOfRow(r)]));
  }

  /** Writes the whole journal, fenced by the lease and the generation: a superseded engine writes nothing. */
  async writeJournal(
    workflowId: string,
    journal: OrchestrationJournal,
    generation: number,
    owner: string,
    q: Queryable = this.pool,
  ): Promise<boolean> {
    return (await this.writeJournalText(workflowId, wholeJournalWrite(journal), generation, owner, q))
      .written;
  }

  /**
   * One journal write in one statement: the header and the rows of the nodes it names, all or nothing,
   * fenced by the lease and the generation (a superseded engine writes nothing). Also answers whether a
   * Stop was recorded for the workflow meanwhile.
   */
  async writeJournalText(
    workflowId: string,
    write: JournalWrite,
    generation: number,
    owner: string,
    q: Queryable = this.pool,
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
      [workflowId, write.header, generation, owner, nodeRowsText(write.nodes)],
    );
    return { written: rows[0]?.written === 1, cancelRequested: rows[0]?.cancel === true };
  }

  /**
   * The whole-workflow summary into the parent's results inbox, exactly once (its id is fixed in the
   * journal; the id of the summary already there for this tool call otherwise), and the journal's removal, in one transaction, after terminal publication has settled. The
   * delegation core then delivers it like any result (appended and acknowledged in the parent's journal).
   */
  async deliverSummary(input: {
    workflowId: string;
    generation: number;
    resultId: string;
    outcome: "ok" | "error";
    body: string;
    /** The tool call the summary answers; the starting call when absent. */
    toolCallId?: string;
    /** The full summary's size when `body` is a spill placeholder, and the spill's record. */
    byteSize?: number;
    spillId?: string;
    keepJournal?: boolean;
  }): Promise<string | null> {
    return tx(this.pool, async (c) => {
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
      let resultId = input.resultId;
      if (!inserted.rows[0]) {
        const existing = await c.query<Row>(
          `select id from delegation_results
            where parent_session_id = $1::uuid and tool_call_id = $2 and kind = 'workflow_summary'`,
          [w.parent_session_id, toolCallId],
        );
        if (existing.rows[0]) resultId = String(existing.rows[0].id);
      }
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

  /** The invalid-journal path: only this workflow ends (status invalid), whatever its generation. */
  async terminalizeInvalid(workflowId: string): Promise<number | null> {
    const { rows } = await this.pool.query<Row>(
      `update workflows set status = 'invalid', updated_at = now() where id = $1::uuid and status <> 'invalid'
       returning generation, ${wake(workflowId)}`,
      [workflowId],
    );
    if (rows[0]) return Number(rows[0].generation);
    const again = await this.pool.query<Row>("select generation from workflows where id = $1::uuid", [
      workflowId,
    ]);
    return again.rows[0] ? Number(again.rows[0].generation) : null;
  }
}
