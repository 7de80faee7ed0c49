import { spawn } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { join, resolve } from "node:path";

/** The crash-injection child (built code): see crash-child.mjs for its config. */
export const crashChildPath = resolve(import.meta.dirname, "crash-child.mjs");

export interface CrashChildConfig {
  readonly databaseUrl: string;
  readonly spillRoot: string;
  readonly effectsFile: string;
  readonly inlineBytes?: number;
  readonly quiesceMs?: number;
  /** The turn runner: the scripted session runner (default) or the real agent loop. */
  readonly runner?: "scripted" | "agent";
  readonly start?: { readonly accountId: string; readonly parentSessionId: string; readonly prompt: string };
}

export interface CrashChildExit {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
}

/**
 * Runs the crash child once. With `fault`, CRW_FAULT makes it SIGKILL itself at that point; the exit then
 * has `signal: "SIGKILL"`. Bounded: a child that outlives `boundMs` is killed and reported.
 */
export function runCrashChild(
  config: CrashChildConfig,
  fault?: string,
  boundMs = 90_000,
): Promise<CrashChildExit> {
  return new Promise((done, fail) => {
    const env: NodeJS.ProcessEnv = { ...process.env, CRW_CRASH_CONFIG: JSON.stringify(config) };
    delete env.CRW_FAULT;
    delete env.NODE_OPTIONS;
    if (fault) env.CRW_FAULT = fault;
    const child = spawn(process.execPath, [crashChildPath], { env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += String(d)));
    child.stderr.on("data", (d) => (stderr += String(d)));
    const timer = setTimeout(() => child.kill("SIGKILL"), boundMs);
    child.on("error", (e) => {
      clearTimeout(timer);
      fail(e);
    });
    child.on("exit", (code, signal) => {
      clearTimeout(timer);
      done({ code, signal, stdout, stderr });
    });
  });
}

function newestMtime(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestMtime(p) : statSync(p).mtimeMs);
  }
  return newest;
}

/** Whether a package's dist is missing or older than its src (then the crash child would run stale code). */
export function distIsStale(packageDir: string): boolean {
  const built = join(packageDir, "dist", "index.js");
  if (!existsSync(built)) return true;
  return newestMtime(join(packageDir, "src")) > statSync(built).mtimeMs;
}
export { journalRows } from "./journal.js";
