export {
  type AppServerHost,
  type AppServerHostEvent,
  type AppServerHostOptions,
  createAppServerHost,
  subagentSourceKinds,
} from "./appServerHost.js";
export { HostProtocolError, HostRpcError, HostUnreachableError } from "./errors.js";
/** The Codex app-server protocol's types crw uses, generated from the pinned `@openai/codex` (generated/VERSION). */
export type * as AppServerProtocol from "./protocolTypes.js";
export { RolloutUnreadableError, readRolloutTokenCount } from "./rolloutTokens.js";
export { type ThreadOptions, threadConfig } from "./threadOps.js";
export { HostSpecError, hostTransportFromSpec } from "./transport/fromSpec.js";
export {
  type CommandTransportOptions,
  commandTransport,
  defaultHostCommand,
} from "./transport/stdioTransport.js";
export type { HostChannel, HostTransport, TransportHandlers } from "./transport/transport.js";
export { wsTransport } from "./transport/wsTransport.js";
