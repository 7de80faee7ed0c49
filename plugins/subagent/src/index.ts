export * from "./definition/index.js";
export * from "./engine/index.js";
export {
  toError,
  WorkflowBoundaryError,
  WorkflowDefinitionError,
  type WorkflowDefinitionErrorCode,
  WorkflowNodePreparationError,
  WorkflowStateError,
  type WorkflowStateErrorCode,
} from "./errors.js";
export {
  type JournalReading,
  NODE_STATUSES,
  type NodeState,
  type NodeStatus,
  type OrchestrationJournal,
  OrchestrationJournalSchema,
  readOrchestrationJournal,
} from "./journal/schema.js";
export * from "./store/index.js";
export { handleWorkflowAddNodes, type WorkflowAddNodesParams } from "./tools/hostRpc.js";
export { type SubagentToolsOptions, subagentTools, workflowTools } from "./tools/index.js";
