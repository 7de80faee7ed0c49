export { RECLAIM_BATCH } from "./delegation/forks.js";
export { listenForOwnerReleases, type OwnerReleaseListener } from "./delegation/ownerReleases.js";
export { OWNER_RELEASED_CHANNEL } from "./delegation/recovery.js";
export { PgDelegationRepository } from "./delegation/repository.js";
export {
  listenForRevocations,
  type RevocationListener,
  TOKEN_REVOKED_CHANNEL,
} from "./delegation/tokens.js";
export { type ProviderUsageReport, recordProviderUsage, sessionPrincipal } from "./delegation/usage.js";
export {
  DEFAULT_SERVER_USER,
  type EmbeddedCluster,
  type EmbeddedClusterOptions,
  EmbeddedPostgresError,
  type EmbeddedPostgresReason,
  ensureDatabase,
  freePort,
  runningPostmaster,
  socketDirFor,
  socketUrl,
  startEmbeddedCluster,
  stopPostmaster,
} from "./embedded/index.js";
export { DelegationDbError, type DelegationDbErrorCode, toError } from "./errors.js";
export {
  addWakeFilter,
  announceWatches,
  type ChannelListener,
  INBOX_WAKE_CHANNEL,
  JOURNAL_WAKE_CHANNEL,
  listenForWakes,
  WATCH_CHANNEL,
  type WakeFilter,
  type WakeHandlers,
  type WakeKind,
  WORKFLOW_WAKE_CHANNEL,
  wakeWanted,
} from "./listen.js";
export { migrate, migrationsDir, migrationsTable } from "./migrate.js";
export { isDatabaseUnavailable, pingDatabase } from "./ping.js";
export { createPool } from "./pool.js";
export * from "./repositories/delegation.js";
export * from "./repositories/journal.js";
export { type Isolation, type Queryable, RETRYABLE_SQLSTATES, tx } from "./tx.js";
export {
  grantWorkflowArtifact,
  grantWorkflowArtifacts,
  putWorkflowArtifactGranted,
  readWorkflowArtifact,
  type WorkflowArtifactKey,
  workflowArtifactGrants,
} from "./workflow/artifacts.js";
export {
  readWorkflowJournals,
  type StoredWorkflowJournal,
  type WorkflowJournalNodeRow,
  type WorkflowJournalNodeText,
  type WorkflowJournalWrite,
  writeWorkflowJournal,
} from "./workflow/journals.js";
export {
  claimInterruptedWorkflows,
  handBackWorkflow,
  listenForWorkflowCancels,
  releaseWorkflow,
  requestWorkflowCancel,
  WORKFLOW_CANCEL_CHANNEL,
  workflowCancelRequested,
} from "./workflow/leases.js";
export {
  createNodeSession,
  createPlannedNodeSession,
  type NewNodeSession,
  type NodeSessionRelation,
  nodeSessionRelations,
} from "./workflow/nodeSessions.js";
export type { NewWorkflow, WorkflowRecovery, WorkflowRow, WorkflowStatus } from "./workflow/rows.js";
export { deliverWorkflowSummary, type WorkflowSummaryHandoff } from "./workflow/summary.js";
export {
  advanceWorkflowGeneration,
  getWorkflow,
  insertWorkflow,
  publishWorkflowSnapshot,
  recoverableWorkflow,
  terminalizeInvalidWorkflow,
  workflowsByIds,
  workflowsOfSession,
} from "./workflow/workflows.js";
