export { AppServerClient } from "./appServerClient.js";
export { type CodexExecOptions, type CodexExecRun, runCodexExec } from "./codexExec.js";
export {
  bundledCatalog,
  type CodexHomeOptions,
  type CodexMcpServer,
  codexBin,
  codexNativeBin,
  mcpServersToml,
  writeCodexHome,
} from "./codexHome.js";
export { FakeAppServer, type FakeAppServerOptions, type ReceivedRequest } from "./fakeAppServer.js";
export {
  FakeHostError,
  FakeHostState,
  type FakeThread,
  type SpawnInput,
  type TurnEnd,
} from "./fakeHostState.js";
export type { FakeUsage, Phase } from "./fakeShapes.js";
export {
  functionCalls,
  functionOutputs,
  MockModel,
  type ModelHandler,
  type ModelReply,
  type ModelRequest,
  type OutputItem,
  streamEvents,
  toolNames,
  toolNamespace,
  type Usage,
  userTexts,
} from "./mockModel.js";
export {
  commandJson,
  type OwnerModelOptions,
  type OwnerModelState,
  ownerModel,
  subagentTurn,
} from "./ownerModel.js";
export {
  controlSocketPath,
  freePort,
  type RealCodex,
  type RealCodexOptions,
  restartRealCodex,
  startRealCodex,
  trustHooks,
} from "./realCodex.js";
