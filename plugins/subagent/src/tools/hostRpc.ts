import type { WorkflowEngine } from "../engine/engine.js";
import { WorkflowStateError } from "../errors.js";

/** The runner protocol's `workflow.addNodes` params (validated by @crw/subagent before a handler sees them). */
export interface WorkflowAddNodesParams {
  readonly workflowId: string;
  readonly nodes: readonly {
    readonly id: string;
    readonly prompt: string;
    readonly dependsOn?: readonly string[];
  }[];
}

/**
 * The daemon's side of a runner's `workflow.addNodes` host call: the same `addNodes` mutation the in-process
 * tool awaits, admitted only for the running node whose child made the call (`context.sessionId`), and
 * answered with the added ids once they are journaled and published.
 */
export async function handleWorkflowAddNodes(
  engine: WorkflowEngine,
  params: WorkflowAddNodesParams,
  context: { readonly sessionId: string },
): Promise<{ added: string[] }> {
  const node = engine.nodeOfSession(context.sessionId);
  const run = node ? engine.run(node.workflowId) : undefined;
  if (!node || !run || node.workflowId !== params.workflowId) {
    throw new WorkflowStateError(
      "node_not_running",
      "workflow.addNodes refused: the calling session is not a running node of this workflow",
      { workflowId: params.workflowId },
    );
  }
  const added = await engine.addNodes({
    workflowId: node.workflowId,
    principalAccountId: run.journal.principalAccountId,
    fromNodeId: node.nodeId,
    callerSessionId: context.sessionId,
    nodes: params.nodes.map((n) => ({ id: n.id, task: n.prompt, dependsOn: [...(n.dependsOn ?? [])] })),
  });
  return { added };
}
