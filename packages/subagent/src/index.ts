export { type BashArgs, BashToolError, bashArgsSchema, runBashTool } from "./bashTool.js";
export { buildIdentityOf } from "./buildIdentity.js";
export type { ChildTurnContext, ChildTurnExecutor } from "./childTurn.js";
export { type Clock, ManualClock, systemClock } from "./clock.js";
export {
  createSubagentRuntime,
  parseSubagentConfig,
  type SubagentConfig,
  type SubagentRuntimeDeps,
  subagentConfigSchema,
} from "./config.js";
export { killContainedProcesses, ProcessContainment } from "./containment.js";
export * from "./errors.js";
export { FairQueue, FairQueueInvariantError } from "./fairQueue.js";
export { EventLoopSampler, HEARTBEAT_INTERVAL_MS, measureProcessTree, type TreeMemory } from "./heartbeat.js";
export {
  DESKTOP_UNKNOWN_OUTCOME_SUFFIX,
  HOST_RPC_CLOSED_TEXT,
  HOST_RPC_DEFAULT_TIMEOUT_MS,
  HostRpcClient,
  HostRpcClosedError,
  HostRpcRefusedError,
  HostRpcRemoteError,
  HostRpcTimeoutError,
  type HostRpcTransport,
} from "./hostRpc.js";
export { type LocalExecCall, LocalExecClient } from "./localExecClient.js";
export { ModelCatalog } from "./modelCatalog.js";
export {
  effectiveRunners,
  type SessionPlacementState,
  SubagentRunnerPool,
  type TurnPlacement,
} from "./pool.js";
export type {
  PoolEvent,
  PoolHealth,
  ProcessChangedSink,
  ProviderUsageSink,
  ResultDeliveredSink,
  RetryProgress,
  RunnerExitTokensSink,
  RunnerPoolSizing,
  SpawnFailure,
  SteerSettledSink,
  SubagentRunnerPoolDeps,
} from "./poolTypes.js";
export {
  assertProtectedDispatch,
  currentWorkflowNodeDispatch,
  type HostWorkflowNodeDispatch,
  ProtectedDispatchBusyError,
  ProtectedDispatchError,
  runWithWorkflowNodeDispatch,
} from "./protectedPlacement.js";
export * from "./protocol/index.js";
export {
  type ProviderUsage,
  type ProviderUsageReport,
  providerUsageSchema,
} from "./providerUsage.js";
export {
  RESTART_REQUIRED_ALERT_KEY,
  type RestartRequiredAlert,
  type RestartRequiredSink,
  restartRequiredAlert,
} from "./restartAlert.js";
export {
  LateBoundRetryPolicySource,
  MemoryRetryPolicySource,
  RetryPolicyMirror,
  type RetryPolicySource,
  RetryPolicyUnavailableError,
  startupRetryDelayMs,
} from "./retryPolicy.js";
export {
  currentDispatchedTurn,
  type DispatchedTurn,
  outsideDispatchedTurn,
  runInDispatchedTurn,
} from "./rpcTurn.js";
export {
  RunnerCore,
  type RunnerExecutor,
  type RunnerFault,
  type RunnerPort,
  type SessionBackendLoader,
} from "./runnerCore.js";
export {
  hasTypeScriptLoader,
  RunnerEntryMissingError,
  resolveRunnerEntry,
  runnerExecArgv,
} from "./runnerEntry.js";
export {
  type HostRpcHandler,
  type HostRpcRequestContext,
  type LocalExecHandler,
  MEASURE_FAILED_TEXT,
  RUNNER_BOOT_TIMEOUT_MS,
  type RunnerHostEvent,
  type RunnerStats,
  type SessionTurnMeta,
  SubagentRunnerHost,
  type SubagentRunnerHostDeps,
  TAP_TIMEOUT_MS,
  type TapHandle,
} from "./runnerHost.js";
export { ScriptedTurnError, ScriptedTurnExecutor } from "./scriptedExecutor.js";
export { loadBrainSessionBackend, type SessionTurnBackend } from "./sessionBackend.js";
export {
  type Placement,
  predictsRunnerDispatch,
  type SessionDispatchDeps,
  SubagentSessionDispatch,
} from "./sessionDispatch.js";
export { ExecutionAuthorityError, SessionViews } from "./sessionViews.js";
