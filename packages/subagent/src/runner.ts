/**
 * The runner process entry (forked by SubagentRunnerHost through RUNNER_ENTRY). It talks to the daemon only
 * over the IPC channel; it reads no database and no default policy.
 *
 * Only the handshake is imported up front: the scripted executor comes with RunnerCore's request handling,
 * right after boot, and the delegation core's session backend with the first session turn, so the fork
 * reaches ready without loading the schema library or anything a turn runs.
 */
import { fileURLToPath } from "node:url";
import { buildIdentityOf } from "./buildIdentity.js";
import type { ChildTurnExecutor } from "./childTurn.js";
import { RunnerCore, type RunnerFault, type SessionBackendLoader } from "./runnerCore.js";

if (!process.send) {
  process.stderr.write("crw runner: must be started by the daemon with an IPC channel\n");
  process.exit(2);
}

const loadExecutor = async (): Promise<ChildTurnExecutor> =>
  new (await import("./scriptedExecutor.js")).ScriptedTurnExecutor();
const loadSessionBackend: SessionBackendLoader = async (options, hooks) =>
  (await import("./sessionBackend.js")).loadBrainSessionBackend(options, hooks);

const fault = (process.env.CRW_RUNNER_FAULT || undefined) as RunnerFault | undefined;
const core = new RunnerCore(
  {
    send: (frame) => {
      if (!process.connected || !process.send) return false;
      return process.send(frame, undefined, undefined, () => {});
    },
    onMessage: (listener) => process.on("message", listener),
    onDisconnect: (listener) => process.on("disconnect", listener),
    exit: (code) => process.exit(code),
    log: (level, msg, fields) =>
      process.stderr.write(`${JSON.stringify({ level, msg, pid: process.pid, ...fields })}\n`),
  },
  loadExecutor,
  `${buildIdentityOf(fileURLToPath(import.meta.url))}${fault === "other-build" ? "-other" : ""}`,
  fault,
  loadSessionBackend,
);
core.start();
