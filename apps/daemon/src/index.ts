export {
  ConfigError,
  type DaemonConfig,
  type DaemonConfigFile,
  defaultDataDir,
  loadConfig,
} from "./config.js";
export { type Daemon, type DaemonPhase, startDaemon } from "./daemon.js";
export { DaemonLockedError, type DaemonState, processAlive, readState, statePath } from "./lifecycle.js";
export { ownerTokenPath } from "./ownerToken.js";

export { RpcError, RpcRegistry } from "./rpc.js";
