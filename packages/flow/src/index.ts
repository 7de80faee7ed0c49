export * from "./bound/index.js";
export { flowHelp, runFlowCli } from "./cli/index.js";
export { type HoldRunOptions, holdRun } from "./cli/runProcess.js";
export { type SessionFact, sessionFacts } from "./cli/sessionFacts.js";
export { answerText, parseAnswer, validateAgainst } from "./engine/answer.js";
export { type BindVerdict, judgeBind, markerTurn } from "./engine/bind.js";
export { addTokens, type CallPosition, callRows, foldCall, subtractTokens } from "./engine/callFold.js";
export { type ConversationTurn, continuationOf, conversationOf, recordOf } from "./engine/continuation.js";
export {
  EVIDENCE_DIR,
  type EvidenceRecord,
  evidenceAssignment,
  evidenceCopies,
  evidenceRecordPath,
  GATED_ROLES,
  newestGeneration,
  placedCwds,
  releaseEvidence,
  restoreEvidence,
  stepEvidence,
  writeEvidenceRecord,
} from "./engine/evidence.js";
export { executeRun } from "./engine/executeRun.js";
export {
  DEFAULT_LOST_AFTER_MS,
  type FlowRunOptions,
  type FlowRunOutcome,
  startedBackend,
} from "./engine/flowRun.js";
export type { FlowEvent } from "./engine/runContext.js";
export { runSpent, TokenFigure, tokenTotal } from "./engine/tokenFigure.js";
export { DEFAULT_WAKE, OwnerWaker, type WakeConfig, type WakeContext } from "./engine/wake.js";
export {
  type CallOptions,
  defineWorkflow,
  FlowCallError,
  type FlowContext,
  type Workflow,
} from "./engine/workflow.js";
export * from "./git/index.js";
export * from "./host/index.js";
export type * from "./host/sessionHost.js";
export { faultKey, parseFaultPoint } from "./journal/fault.js";
export {
  JOURNAL_FILE,
  type JournalRead,
  JournalWriter,
  parseJournal,
  readJournalFile,
} from "./journal/journal.js";
export * from "./journal/rows.js";
export {
  type CancelRequest,
  cancelRequestPath,
  readCancelRequest,
  writeCancelRequest,
} from "./run/cancelRequest.js";
export { BUILTIN_AGENT_TYPES, type CodexSettings, readCodexSettings } from "./run/codexConfig.js";
export { heldProcessLocks, lockHolder, tryLock, unlock } from "./run/locks.js";
export { checkRunId, type RunPaths, runPaths, stateDirFrom } from "./run/paths.js";
export {
  overlayForPacket,
  ROLE_STORE_PATH,
  type RoleTable,
  readRoleTable,
  resolveTable,
  rolePairs,
} from "./run/roles.js";
export { type RunState, readRunState } from "./run/runState.js";
export { checkSpec, type RunSpec, readSpec, SPEC_FORMAT, writeSpec } from "./run/spec.js";
export { dirFrom, unusable } from "./run/tmploc.js";
export { type Divergence, type ShadowReport, shadowReplay } from "./shadow/replay.js";
export { type DispatchReport, type Reply, readReply, reportName, writeReport } from "./steps/inbox.js";
export { markerInText, markerOf, sendInputMessage, spawnMessage } from "./steps/message.js";
export { buildPacket, repositoryTools } from "./steps/packet.js";
export {
  type CloseFile,
  FileStepBus,
  type ListedSteps,
  listCallStepFiles,
  listStepFiles,
  type StepFile,
} from "./steps/stepBus.js";
export { canonicalJson, digestOf } from "./util/canonical.js";
export { EXIT_INPUT, EXIT_OK, EXIT_REFUSED, FlowError } from "./util/errors.js";
export { pidAlive } from "./util/liveness.js";
