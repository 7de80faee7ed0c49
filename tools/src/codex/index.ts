export { FakeAppServer, type FakeAppServerOptions, type ReceivedRequest } from "./fakeAppServer.js";
export {
  FakeHostError,
  FakeHostState,
  type FakeThread,
  type SpawnInput,
  type TurnEnd,
} from "./fakeHostState.js";
export type { FakeUsage, Phase } from "./fakeShapes.js";
