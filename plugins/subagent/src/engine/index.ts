export {
  authorityOf,
  type BoundaryVerdict,
  boundaryAgainst,
  captureNodeScope,
  currentDelegatedAccess,
  normalizeOriginAccess,
  type OriginAccessInput,
  originScope,
  type ValidateBoundary,
} from "./access.js";
export {
  type CompletionSink,
  captureOriginBindings,
  type ExpansionMode,
  hostAccessors,
  type OriginBindings,
  type PreparedSummary,
  type SummaryWriter,
  type WorkflowCompletion,
  type WorkflowHostAccessors,
} from "./context.js";
export { delegationNodeTurns } from "./delegationTurns.js";
export type {
  NodeChildRequest,
  NodeContinueRequest,
  NodeDispatcher,
  NodeEvent,
  NodeOutputReference,
  NodeRecoveryHost,
  NodeRunRequest,
  NodeRunResult,
  RecoveryContinueNode,
  WorkflowNodeContinueInput,
  WorkflowNodeContinueResult,
} from "./dispatch.js";
export {
  type StartedWorkflow,
  uuidFrom,
  type WorkflowCallContext,
  WorkflowEngine,
  type WorkflowEngineOptions,
} from "./engine.js";
export { WORKFLOW_FAULT_POINTS, type WorkflowFaultPoint, workflowFault } from "./faults.js";
export { type LandedNode, landWorkflowNodes } from "./isolation.js";
export {
  JournalNodeDispatcher,
  journalTurnExecutor,
  NODE_SYSTEM_PROMPT,
  type NodeTurnExecutor,
  type NodeTurnRunner,
  outputReferences,
  scriptedNodeTurnRunner,
} from "./journalDispatcher.js";
export { HANDOVER_CHARS, handoverOf, nodePrompt, workflowSummary } from "./prompt.js";
export {
  pgWorkflowEmitter,
  SnapshotPublisher,
  type WorkflowEmitResult,
  type WorkflowEmitter,
  type WorkflowSnapshot,
  type WorkflowUpdate,
} from "./publication.js";
export type { WorkflowEvent, WorkflowOutcome } from "./run.js";
export { WorkflowRun } from "./run.js";
