import { AsyncResource } from "node:async_hooks";

/**
 * What the engine takes from its host's live context at WorkflowStart and explicit WorkflowResume. Each
 * accessor is always supplied by core; a capability the host lacks is the accessor's `null` (or `false`)
 * result, never a missing accessor. Boot recovery has no live context: it uses the engine's own options.
 */
export interface WorkflowCompletion {
  readonly workflowId: string;
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly resultId: string;
  readonly status: string;
}

/** The unified delegationCompletionEmitter: told once the summary is in the parent's inbox. */
export type CompletionSink = (completion: WorkflowCompletion) => Promise<void>;

export interface PreparedSummary {
  readonly body: string;
  readonly byteSize: number;
  readonly spillId?: string;
}

/** The origin-bound output writer: an above-limit summary is spilled for its recipient, the inbox gets a placeholder. */
export type SummaryWriter = (
  summary: string,
  outcome: "ok" | "error",
  workflowId: string,
) => Promise<PreparedSummary>;

export interface WorkflowHostAccessors {
  delegationCompletionEmitter(): Promise<CompletionSink | null>;
  captureToolOutputWriter(): Promise<SummaryWriter | null>;
  /** Whether node turns run in runner processes (then a node extends its workflow through the RPC). */
  delegatedTurnsOutOfProcess(): Promise<boolean>;
  /** The runner's `workflow.addNodes` capability (null: runners cannot extend workflows). */
  workflowExpansionRpc(): Promise<object | null>;
}

export type ExpansionMode = "local" | "rpc" | "none";

export interface OriginBindings {
  readonly completion: CompletionSink | null;
  readonly writer: SummaryWriter | null;
  readonly expansion: ExpansionMode;
}

/**
 * Awaits the accessors in order: the summary writer before it is stored, whether turns run out of process
 * before deciding how nodes extend the workflow, the expansion RPC only when they do.
 */
export async function captureOriginBindings(host: WorkflowHostAccessors): Promise<OriginBindings> {
  // Bound to the origin's async context (the live tool call): whatever later triggers them (a node's
  // settlement, a Stop recorded by another caller, a cancel notification), they run as the origin would.
  const origin = new AsyncResource("crw.workflow.origin");
  const completionSink = await host.delegationCompletionEmitter();
  const writerSink = await host.captureToolOutputWriter();
  const completion: CompletionSink | null = completionSink
    ? (c) => origin.runInAsyncScope(completionSink, undefined, c)
    : null;
  const writer: SummaryWriter | null = writerSink
    ? (summary, outcome, workflowId) =>
        origin.runInAsyncScope(writerSink, undefined, summary, outcome, workflowId)
    : null;
  const outOfProcess = await host.delegatedTurnsOutOfProcess();
  const expansion: ExpansionMode = outOfProcess
    ? (await host.workflowExpansionRpc())
      ? "rpc"
      : "none"
    : "local";
  return { completion, writer, expansion };
}

/** Accessors over plain values, for hosts that know their capabilities up front. */
export function hostAccessors(
  values: {
    completion?: CompletionSink | null;
    writer?: SummaryWriter | null;
    outOfProcess?: boolean;
    expansionRpc?: object | null;
  } = {},
): WorkflowHostAccessors {
  return {
    delegationCompletionEmitter: async () => values.completion ?? null,
    captureToolOutputWriter: async () => values.writer ?? null,
    delegatedTurnsOutOfProcess: async () => values.outOfProcess ?? false,
    workflowExpansionRpc: async () => values.expansionRpc ?? null,
  };
}
