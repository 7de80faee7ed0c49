export {
  CapturedWrites,
  pausedError,
  type RestartCheckpoint,
  RestartCheckpointError,
} from "./checkpoint.js";
export { assertClientDriven, openClientSession, type ResultNews, takeResults } from "./clientSessions.js";
export { contextFromJournal, danglingToolCalls, endsWithAnswer } from "./context.js";
export {
  type DelegationEvent,
  type Delivered,
  drainResults,
  type ResultDeliveredEvent,
  resultMessage,
} from "./delivery.js";
export {
  DelegationError,
  type DelegationErrorCode,
  type HostContract,
  HostContractError,
  hostContract,
} from "./errors.js";
export { FAULT_POINTS, type FaultPoint, faultPoint } from "./faults.js";
export { type Isolation, isolationKey, type LandedWork } from "./isolation.js";
export { KeyedMutex, Notifier } from "./notifier.js";
export {
  type ProgressPace,
  ProgressPublicationError,
  type ProgressPublisher,
  RunProgressJob,
  type RunProgressSnapshot,
} from "./progress.js";
export {
  ASSISTANT_PAGE,
  lastSettledAssistantText,
  latestAssistantText,
  readSubagent,
} from "./readSubagent.js";
export {
  followUpQueued,
  INTERRUPTED_CONTEXT,
  idleRootParents,
  type RecoveryReport,
  recoverDelegations,
  settleInterruptedTails,
  takeOverDelegations,
} from "./recovery.js";
export { type MutatingTool, scopedTools } from "./scopedTools.js";
export {
  createScriptedTurnRunner,
  type Script,
  scriptedTurnReply,
  scriptSchema,
  scriptTask,
} from "./scripted.js";
export {
  assertAddressable,
  assertForkContextAvailable,
  type ContinueArgs,
  type DelegateArgs,
  type DelegationCompletion,
  type DelegationReceipt,
  DelegationService,
  type DelegationServiceOptions,
  type DreamArgs,
  type PendingResultDrainOutcome,
} from "./service.js";
export {
  DEFAULT_TOOL_RESULT_INLINE_BYTES,
  FileSpillStore,
  type PreparedCompletion,
  prepareCompletion,
  type SpillStore,
} from "./spill.js";
export { SPILL_READ_PAGE, spillReadTool, textPage } from "./spillRead.js";
export { delegationTools } from "./tools.js";
export type {
  ProgressEvent,
  ProgressSink,
  RecordMeta,
  SessionTurnRunner,
  ToolContext,
  ToolOutput,
  TurnErrorData,
  TurnHost,
  TurnOutcome,
  TurnPurpose,
  TurnRequest,
  TurnTool,
  TurnUsageTotals,
} from "./turn.js";
export { addUsage, turnErrorData, turnFailureCause } from "./turn.js";
export { type SessionTurnInput, SessionTurns } from "./turns.js";
export type { BackgroundCompletion, OutputRecipient } from "./types.js";
export {
  type ForkPrefixDiagnostics,
  forkPrefixDiagnostics,
  newestUsageBearingResponse,
  type UsageBearingResponse,
  type UsagePaging,
} from "./usage.js";
