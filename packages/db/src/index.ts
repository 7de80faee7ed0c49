export { RECLAIM_BATCH } from "./delegation/forks.js";
export { PgDelegationRepository } from "./delegation/repository.js";
export {
  DEFAULT_SERVER_USER,
  type EmbeddedCluster,
  type EmbeddedClusterOptions,
  EmbeddedPostgresError,
  type EmbeddedPostgresReason,
  freePort,
  runningPostmaster,
  startEmbeddedCluster,
  stopPostmaster,
} from "./embedded/index.js";
export { DelegationDbError, type DelegationDbErrorCode, toError } from "./errors.js";
export { migrate, migrationsDir, migrationsTable } from "./migrate.js";
export * from "./repositories/delegation.js";
export * from "./repositories/journal.js";
export { type Isolation, type Queryable, RETRYABLE_SQLSTATES, tx } from "./tx.js";
