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
