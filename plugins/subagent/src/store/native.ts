import {
  advanceWorkflowGeneration,
  claimInterruptedWorkflows,
  deliverWorkflowSummary,
  getWorkflow,
  handBackWorkflow,
  insertWorkflow,
  type NewWorkflow,
  publishWorkflowSnapshot,
  type Queryable,
  readWorkflowJournals,
  recoverableWorkflow,
  releaseWorkflow,
  requestWorkflowCancel,
  type StoredWorkflowJournal,
  terminalizeInvalidWorkflow,
  type WorkflowRecovery,
  type WorkflowRow,
  type WorkflowStatus,
  type WorkflowSummaryHandoff,
  workflowCancelRequested,
  workflowsByIds,
  workflowsOfSession,
  writeWorkflowJournal,
} from "@crw/db";
import type pg from "pg";
import type { OrchestrationJournal } from "../journal/schema.js";
import { TickBatchedReader } from "./batch.js";
import { assembleJournal, type JournalWrite, type NodeRow, wholeJournalWrite } from "./journalLayout.js";

// The record's rows and statements are @crw/db's; these names stay the plugin's public ones.
export type { NewWorkflow, WorkflowRecovery, WorkflowRow, WorkflowStatus };

export const TERMINAL_WORKFLOW_STATUSES: ReadonlySet<WorkflowStatus> = new Set([
  "completed",
  "failed",
  "cancelled",
  "invalid",
]);

/** A journal as read: the whole document of before, or a header assembled with its node rows. */
function journalOf(stored: StoredWorkflowJournal): unknown {
  if (stored.nodes === null) return stored.body;
  return assembleJournal(stored.body, stored.nodes as NodeRow[]);
}

/**
 * The host side of workflow persistence: the native record and its fenced publication, the engine's
 * ownership lease, the orchestration journal and the summary handoff into the parent's results inbox.
 */
export class PgWorkflowStore {
  readonly #rows = new TickBatchedReader<string, WorkflowRow>((ids) => workflowsByIds(this.pool, ids));

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
  insertWorkflow(input: NewWorkflow): Promise<{ id: string; inserted: boolean }> {
    return insertWorkflow(this.pool, input);
  }

  /** The recovery proof of a workflow, read back from the native row (`recoverableWorkflow`). */
  recoverableWorkflow(workflowId: string): Promise<WorkflowRecovery | null> {
    return recoverableWorkflow(this.pool, workflowId);
  }

  getWorkflow(workflowId: string, principalAccountId?: string): Promise<WorkflowRow | null> {
    return getWorkflow(this.pool, workflowId, principalAccountId);
  }

  /** The workflows a session started, oldest first. */
  workflowsOfSession(
    parentSessionId: string,
    principalAccountId: string,
    limit = 200,
  ): Promise<WorkflowRow[]> {
    return workflowsOfSession(this.pool, parentSessionId, principalAccountId, limit);
  }

  /**
   * A fenced snapshot write: accepted only under `expectedGeneration` and, when `owner` is given, only while
   * that owner holds the row's lease; never moving a terminal record back to running. `updated` includes
   * terminal updates; a refused write publishes nothing (`stale`).
   */
  publishSnapshot(
    workflowId: string,
    snapshot: unknown,
    status: WorkflowStatus,
    expectedGeneration: number,
    owner?: string,
  ): Promise<"updated" | "stale"> {
    return publishWorkflowSnapshot(this.pool, workflowId, { snapshot, status, expectedGeneration, owner });
  }

  /**
   * Explicit WorkflowResume's terminal-to-running bridge: a new generation (older writers become stale),
   * the same admission version, and the lease to the resuming process. Null when not terminal.
   */
  advanceWorkflowGeneration(input: {
    workflowId: string;
    toolCallId: string;
    principalAccountId: string;
    owner: string;
  }): Promise<WorkflowRecovery | null> {
    return advanceWorkflowGeneration(this.pool, input);
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
    return claimInterruptedWorkflows(this.pool, owner, limit, options);
  }

  /**
   * A Stop for a workflow another process drives: recorded on the row and announced to its owner (channel
   * crw_workflow_cancel). False when the workflow is not running (or not this account's).
   */
  requestCancel(workflowId: string, principalAccountId: string): Promise<boolean> {
    return requestWorkflowCancel(this.pool, workflowId, principalAccountId);
  }

  /** Whether a Stop was recorded for the workflow (read by its owner at each journal write and at boot). */
  cancelRequested(workflowId: string): Promise<boolean> {
    return workflowCancelRequested(this.pool, workflowId);
  }

  releaseWorkflow(workflowId: string, owner: string): Promise<void> {
    return releaseWorkflow(this.pool, workflowId, owner);
  }

  /** A live takeover that could not resume what it claimed hands it back, for the next sweep to claim. */
  handBackWorkflow(workflowId: string, owner: string): Promise<void> {
    return handBackWorkflow(this.pool, workflowId, owner);
  }

  /** The workflow's journal, assembled from its header and node rows (null when it has none). */
  async readJournal(workflowId: string): Promise<unknown | null> {
    return (await this.readJournals([workflowId])).get(workflowId.toLowerCase()) ?? null;
  }

  /** The journals of several workflows in one read; a workflow without one is absent from the map. */
  async readJournals(workflowIds: readonly string[]): Promise<Map<string, unknown>> {
    const stored = await readWorkflowJournals(this.pool, workflowIds);
    return new Map([...stored].map(([id, journal]) => [id, journalOf(journal)]));
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
  writeJournalText(
    workflowId: string,
    write: JournalWrite,
    generation: number,
    owner: string,
    q: Queryable = this.pool,
  ): Promise<{ written: boolean; cancelRequested: boolean }> {
    return writeWorkflowJournal(q, workflowId, write, { generation, owner });
  }

  /**
   * The whole-workflow summary into the parent's results inbox, exactly once, and the journal's removal,
   * in one transaction, after terminal publication has settled (see deliverWorkflowSummary in @crw/db).
   */
  deliverSummary(input: WorkflowSummaryHandoff): Promise<string | null> {
    return deliverWorkflowSummary(this.pool, input);
  }

  /** The invalid-journal path: only this workflow ends (status invalid), whatever its generation. */
  terminalizeInvalid(workflowId: string): Promise<number | null> {
    return terminalizeInvalidWorkflow(this.pool, workflowId);
  }
}
