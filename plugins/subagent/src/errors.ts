/**
 * The workflow engine's typed errors. Each has a stable `code` (match on it, or on `name`, across a process
 * boundary; never on `instanceof` or the message), readonly `context` for diagnostics, and a stated
 * `retryable`: whether the same request may succeed later without a change by the caller.
 */

export type WorkflowDefinitionErrorCode =
  | "definition_unreadable"
  | "definition_too_large"
  | "definition_changed"
  | "definition_syntax"
  | "definition_invalid"
  | "duplicate_node"
  | "unknown_dependency"
  | "dependency_cycle"
  | "too_many_nodes";

/** A definition (or an added node list) refused as a whole: nothing was created or changed. */
export class WorkflowDefinitionError extends Error {
  override readonly name = "WorkflowDefinitionError";
  readonly retryable = false;
  constructor(
    readonly code: WorkflowDefinitionErrorCode,
    message: string,
    readonly context: Readonly<Record<string, unknown>> = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

export type WorkflowStateErrorCode =
  | "workflow_not_found"
  | "node_not_found"
  | "not_running"
  | "not_resumable"
  | "invalid_journal"
  | "stale_generation"
  | "missing_recovery_proof"
  | "lease_lost"
  | "node_not_running"
  | "expansion_unavailable"
  | "child_mismatch"
  | "artifact_not_granted";

export class WorkflowStateError extends Error {
  override readonly name = "WorkflowStateError";
  constructor(
    readonly code: WorkflowStateErrorCode,
    message: string,
    readonly context: Readonly<Record<string, unknown>> = {},
    readonly retryable = false,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** An explicit resume refused because journaled authority exceeds current access: nothing was started. */
export class WorkflowBoundaryError extends Error {
  override readonly name = "WorkflowBoundaryError";
  readonly code = "boundary_refused" as const;
  readonly retryable = false;
  constructor(
    message: string,
    readonly context: Readonly<{ subject: string; reason: string }>,
  ) {
    super(message);
  }
}

/** A node dependency could not be prepared (artifact, grant, scope); the original error stays as `cause`. */
export class WorkflowNodePreparationError extends Error {
  override readonly name = "WorkflowNodePreparationError";
  readonly code = "node_preparation_failed" as const;
  readonly retryable = false;
  constructor(
    message: string,
    readonly context: Readonly<{ workflowId: string; nodeId: string }>,
    options: { cause: unknown },
  ) {
    super(message, options);
  }
}

export function toError(e: unknown): Error {
  return e instanceof Error ? e : new Error(String(e));
}
