import { type ChildProcess, fork } from "node:child_process";
import { type OutputFrame, parseOutputFrame } from "@crw/subagent";
import { afterEach } from "vitest";
import { BUILD_ID, RUNNER_ENTRY } from "./runners.js";

/** A boot frame for a runner forked straight from the test (no host): this build, a quiet heartbeat. */
export const bootFrame = {
  type: "boot",
  requestId: "boot",
  runnerId: "r",
  buildId: BUILD_ID,
  retryPolicy: { revision: 1, maxRetries: 0, initialDelayMs: 0, multiplier: 1 },
  catalog: { revision: 1, public: [], accounts: {} },
  heartbeatIntervalMs: 60_000,
};

const children: ChildProcess[] = [];
afterEach(() => {
  for (const c of children.splice(0)) c.kill("SIGKILL");
});

/**
 * The built runner forked with a bare IPC channel and no host in between: what it posts (valid frames, and
 * anything the protocol refuses), its stderr and its exit code. Killed after each test of the importing file.
 */
export function forkRunner(execArgv: string[] = []) {
  const child = fork(RUNNER_ENTRY, [], {
    execArgv,
    stdio: ["ignore", "ignore", "pipe", "ipc"],
    serialization: "json",
  });
  children.push(child);
  const frames: OutputFrame[] = [];
  const invalid: unknown[] = [];
  let stderr = "";
  child.stderr?.setEncoding("utf8").on("data", (d: string) => {
    stderr += d;
  });
  child.on("message", (raw) => {
    const parsed = parseOutputFrame(raw);
    if (parsed.ok) frames.push(parsed.frame);
    else invalid.push(raw);
  });
  let exitCode: number | null | undefined;
  const exited = new Promise<number | null>((res) =>
    child.once("exit", (code) => {
      exitCode = code;
      res(code);
    }),
  );
  return { child, frames, invalid, exited, hasExited: () => exitCode !== undefined, stderr: () => stderr };
}
