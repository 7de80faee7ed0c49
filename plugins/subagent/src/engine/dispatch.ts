import type { ComputerPrerequisite } from "../journal/schema.js";

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
  continueNode(request: NodeContinueRequest): Promise<NodeRunResult>;
}

export interface NodeChildRequest {
  readonly workflowId: string;
  readonly nodeId: string;
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly model: string;
  /** Canonical JSON of the child's captured DelegatedExecutionScope. */
  readonly scope: string;
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
  /** The node's original task (with its handovers), used only when the child's transcript is empty. */
  readonly task: string;
  /** An explicit retry (WorkflowResume of an interrupted node): appended as a new user task. */
  readonly fallbackPrompt?: string;
}

export type NodeRunResult =
  | { readonly status: "answered" | "continued"; readonly reply: string }
  | { readonly status: "waiting"; readonly prerequisite: ComputerPrerequisite }
  | { readonly status: "empty" }
  | { readonly status: "failed"; readonly error: { readonly code: string; readonly message: string } }
  | { readonly status: "aborted" };

export type NodeEvent =
  | { readonly type: "text"; readonly text: string }
  | { readonly type: "tool"; readonly name: string };
