/**
 * Named fault points of the workflow engine, for crash tests with real processes: when CRW_WORKFLOW_FAULT
 * names a point, the process SIGKILLs itself the first time it gets there (no hook runs, as in a real
 * crash). Without the variable, a point costs one environment read.
 */
export const WORKFLOW_FAULT_POINTS = [
  "node.reserved", // the reservation is journaled and published, before any preparation
  "node.child_inserted", // the child row exists, before the journal places it (its planned id is journaled)
  "node.child_created", // the planned child is journaled, before its task is
  "node.settling", // the child's answer is in its journal, before the engine records the node as done
  "workflow.terminal_published", // terminal publication accepted, before the summary reaches the inbox
] as const;
export type WorkflowFaultPoint = (typeof WORKFLOW_FAULT_POINTS)[number];

export function workflowFault(point: WorkflowFaultPoint): void {
  if (process.env.CRW_WORKFLOW_FAULT === point) process.kill(process.pid, "SIGKILL");
}
