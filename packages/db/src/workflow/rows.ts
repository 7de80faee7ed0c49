import type { Row } from "../delegation/rows.js";
import { WORKFLOW_WAKE_CHANNEL, wakeWanted } from "../listen.js";

/** The native record's recovery metadata (the host's proof; never inferred from the journal's run number). */
export interface WorkflowRecovery {
  readonly workflowGeneration: number;
  readonly recoveryAdmissionVersion: number;
}

export type WorkflowStatus = "running" | "completed" | "failed" | "cancelled" | "invalid";

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

export interface NewWorkflow {
  readonly id: string;
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly toolCallId: string;
  readonly name: string;
  readonly snapshot: unknown;
  readonly owner: string;
}

export function recoveryFromRow(r: Row): WorkflowRecovery {
  return {
    workflowGeneration: Number(r.generation),
    recoveryAdmissionVersion: Number(r.recovery_admission_version),
  };
}

export function workflowFromRow(r: Row): WorkflowRow {
  return {
    id: String(r.id),
    parentSessionId: String(r.parent_session_id),
    principalAccountId: String(r.principal_account_id),
    toolCallId: String(r.tool_call_id),
    name: String(r.name),
    status: r.status as WorkflowStatus,
    recovery: recoveryFromRow(r),
    snapshot: r.snapshot,
    publishedCount: Number(r.published_count),
    summaryResultId: r.summary_result_id === null ? null : String(r.summary_result_id),
    lockedBy: r.locked_by === null ? null : String(r.locked_by),
    cancelRequested: r.cancel_requested_at !== null && r.cancel_requested_at !== undefined,
  };
}

/**
 * The workflow wake, in the statement of each write a follower shows (node states in the journal, the
 * snapshot and status, the summary handoff): sent at commit, so `workflow.follow` in any daemon re-reads
 * at once. Selected only from the changed row, so a refused (fenced) write wakes nobody; sent only when some
 * process watches the workflow (see `wakeWanted` in listen.ts: notifying commits are serialized).
 */
export const wake = (workflowId: string, idColumn = "id") =>
  wakeWanted("workflow", workflowId)
    ? `pg_notify('${WORKFLOW_WAKE_CHANNEL}', ${idColumn}::text) as woke`
    : "null as woke";
