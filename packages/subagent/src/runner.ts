/**
 * The runner process entry (forked by SubagentRunnerHost through RUNNER_ENTRY). It talks to the daemon only
 * over the IPC channel; it reads no database and no default policy.
 */
import { fileURLToPath } from "node:url";
import { buildIdentityOf } from "./buildIdentity.js";
import { RunnerCore, type RunnerFault } from "./runnerCore.js";
import { ScriptedTurnExecutor } from "./scriptedExecutor.js";
import { loadBrainSessionBackend } from "./sessionBackend.js";

if (!process.send) {
  process.stderr.write("crw runner: must be started by the daemon with an IPC channel\n");
  process.exit(2);
}

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
  new ScriptedTurnExecutor(),
  `${buildIdentityOf(fileURLToPath(import.meta.url))}${fault === "other-build" ? "-other" : ""}`,
  fault,
  loadBrainSessionBackend,
);
core.start();
