export { BoundError, type BoundErrorCode } from "./errors.js";
export { type HookResult, runPreToolUse, transcriptIsSubagent } from "./hook.js";
export {
  codexHomeFrom,
  type HookListEntry,
  hookBlock,
  type InstallOptions,
  type InstallOutcome,
  installHook,
  withTrustedHash,
} from "./install.js";
export { type CollabSpawnItem, type OpSpawn, spawnsOfOp } from "./join.js";
export { appendLedger, type LedgerLine, ledgerFile, ledgerLine, readLedger } from "./ledger.js";
export {
  type BoundLine,
  type ClosedLine,
  decidedPair,
  HELPER_ROLES,
  type HelperPair,
  type HelperRole,
  helperPairsFrom,
  type OrchestratorLine,
  pairOf,
  REQUIRED_ROLES,
  samePairs,
  serializeLine,
  validateLine,
} from "./line.js";
export { withDirLock } from "./lock.js";
export {
  bindRunOwner,
  closeRunOwner,
  type OwnerLineWarningKind,
  ownerLineWarning,
  type RunOwner,
} from "./run.js";
export {
  agentTypeRole,
  decideSpawn,
  headerRole,
  hookOutput,
  opOf,
  type PreToolUseInput,
  parseHookInput,
  type RefusalReason,
  ROLE_AGENT_TYPE,
  type SpawnDecision,
  type SpawnWarning,
  spawnText,
} from "./spawn.js";
export {
  type BindingRead,
  type BindOptions,
  type BindOutcome,
  BOUND_DIR,
  bindingFile,
  bindOrchestrator,
  boundDir,
  type CloseOutcome,
  checkTrusted,
  closeOrchestrator,
  parseBoundFile,
  readBinding,
  runIsLive,
} from "./store.js";
