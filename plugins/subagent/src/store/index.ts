export { type ArtifactRef, PgArtifactStore, sha256Hex, workflowArtifactPath } from "./artifacts.js";
export {
  type NewWorkflow,
  PgWorkflowStore,
  TERMINAL_WORKFLOW_STATUSES,
  type WorkflowRecovery,
  type WorkflowRow,
  type WorkflowStatus,
} from "./native.js";
