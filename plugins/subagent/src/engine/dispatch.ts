/**
 * The seam through which the engine runs a node: the same delegated path a Delegate call takes (a child
 * session under the workflow's parent, a captured scope, a model), minus the subagent run row, because a
 * workflow node stays owned by its engine. An implementation must:
 *  1. create the child durably in `createChild` (a planned child: it survives a restart before it runs);
 *  2. in `runNode`, journal the prompt into the child and run one turn, returning the outcome as data
 *     (never throwing for a provider failure), and stop promptly when `signal` aborts (`aborted`);
 *  3. in `continueNode`, never start a second child: reuse a settled answer, resume an interrupted turn
 *     from its transcript, run `task` only when the transcript is empty (and report `empty` without it).
 */
export interface NodeDispatcher {
  createChild(request: NodeChildRequest): Promise<string>;
  runNode(request: NodeRunRequest): Promise<NodeRunResult>;
  /**
   * `host` holds the host-only arguments of a recovery continuation (never part of the input object, never
   * sent over runner RPC): `startFresh` on the daemon-local recovery path only.
   */
  continueNode(request: NodeContinueRequest, host?: NodeRecoveryHost): Promise<NodeRunResult>;
}

/** Host-only arguments of a recovery continuation; see NodeDispatcher.continueNode. */
export interface NodeRecoveryHost {
  /**
   * Daemon-local recovery of a planned child whose transcript is empty: builds the node's original task
   * (with its handovers) when it is actually needed. Never passed by a live caller or over runner RPC.
   */
  readonly startFresh?: () => Promise<string>;
}

/** The canonical continuation input and result: one object in, one outcome (as data) out. */
export type WorkflowNodeContinueInput = NodeContinueRequest;
export type WorkflowNodeContinueResult = NodeRunResult;

/**
 * The recovery hook's continueNode: boot recovery takes this type (a host may supply its own; the engine's
 * dispatcher is the default).
 */
export type RecoveryContinueNode = (
  input: WorkflowNodeContinueInput,
  host?: NodeRecoveryHost,
) => Promise<WorkflowNodeContinueResult>;

export interface NodeChildRequest {
  readonly workflowId: string;
  readonly nodeId: string;
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly model: string;
  /** Canonical JSON of the child's captured DelegatedExecutionScope. */
  readonly scope: string;
  /**
   * The journaled planned id: the child is created with it, or adopted when a row with it exists (empty,
   * same parent and principal) because an earlier process was killed right after inserting it.
   */
  readonly childSessionId?: string;
}

export interface NodeRunRequest {
  readonly workflowId: string;
  readonly nodeId: string;
  readonly childSessionId: string;
  readonly principalAccountId: string;
  readonly model: string;
  readonly scope: string;
  readonly prompt: string;
  readonly signal: AbortSignal;
  readonly onEvent?: (event: NodeEvent) => void;
}

/** Canonical continuation input: one admission-shaped object; the fresh task is data, never a callback. */
export interface NodeContinueRequest extends Omit<NodeRunRequest, "prompt"> {
  /**
   * The workflow's parent session: the child must durably be a delegated child of it (and of the same
   * principal), checked before anything continues.
   */
  readonly parentSessionId?: string;
  /**
   * The node's original task as data (a live caller's data-only preflight), used only when the child's
   * transcript is empty. The daemon-local recovery path passes `startFresh` as a host argument instead.
   */
  readonly task?: string;
  /** An explicit retry (WorkflowResume of an interrupted node): appended as a new user task. */
  readonly fallbackPrompt?: string;
}

export type NodeRunResult =
  | {
      readonly status: "answered" | "continued";
      readonly reply: string;
      /** Every tool-result reference across the child's whole context (stored with the node's artifact). */
      readonly outputs?: readonly NodeOutputReference[];
    }
  | { readonly status: "empty" }
  | { readonly status: "failed"; readonly error: { readonly code: string; readonly message: string } }
  | { readonly status: "aborted" };

/** A tool result (or delivered delegation result) in a node child's transcript that names a stored output. */
export interface NodeOutputReference {
  readonly toolName: string;
  readonly toolCallId?: string;
  readonly resultId?: string;
  readonly childSessionId?: string;
  readonly spillPath?: string;
  readonly byteSize?: number;
  readonly isError?: boolean;
}

export type NodeEvent =
  | { readonly type: "text"; readonly text: string }
  | { readonly type: "tool"; readonly name: string };
