/**
 * What a command that starts, stops, asks after or connects to a daemon needs without running one: the
 * configuration, the state of the daemon recorded on a data directory, and where its owner's token is. An
 * entry of its own, so that `crw daemon status` or `crw session create` loads neither the runtime nor the
 * runner pool nor the workflow plugin (0.2-0.4 s of CPU less a command).
 */
export { ConfigError, type DaemonConfig, defaultDataDir, loadConfig } from "./config.js";
export { type DaemonState, processAlive, readState } from "./lifecycle.js";
export { ownerTokenPath } from "./ownerToken.js";
