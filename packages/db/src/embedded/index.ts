export {
  type EmbeddedCluster,
  type EmbeddedClusterOptions,
  freePort,
  socketDirFor,
  socketUrl,
  startEmbeddedCluster,
} from "./cluster.js";
export { ensureDatabase } from "./database.js";
export { EmbeddedPostgresError, type EmbeddedPostgresReason } from "./errors.js";
export { runningPostmaster, stopPostmaster } from "./postmaster.js";
export { DEFAULT_SERVER_USER } from "./serverUser.js";
