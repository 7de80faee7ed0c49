export { type Alert, AlertService, alertsPath } from "./alerts.js";
export {
  ConfigError,
  type DaemonConfig,
  type DaemonConfigFile,
  type DaemonConfigInput,
  defaultDataDir,
  loadConfig,
} from "./config.js";
export {
  type Daemon,
  type DaemonPhase,
  type StartDaemonOptions,
  type StopOutcome,
  startDaemon,
} from "./daemon.js";
export { DaemonLockedError, type DaemonState, processAlive, readState, statePath } from "./lifecycle.js";
export { ownerTokenPath } from "./ownerToken.js";
export { RpcError, RpcRegistry } from "./rpc.js";
export {
  type BootRecovery,
  type DaemonRuntime,
  type DeliveryNotice,
  delegatedWorkflowExpansionAvailable,
  type ExecutionLocation,
  IN_PROCESS_RUNNER_ID,
  type TurnObserver,
} from "./runtime.js";
