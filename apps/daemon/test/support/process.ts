import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { readState } from "../../src/index.js";

const fixture = resolve(import.meta.dirname, "../fixtures/daemon-process.mjs");
const built = resolve(import.meta.dirname, "../../dist/index.js");

export interface DaemonProcess {
  readonly child: ChildProcess;
  readonly url: string;
  readonly token: string;
  /** Resolves with the exit signal or code. */
  readonly exited: Promise<string>;
  /** The daemon's log lines (pino JSON on stdout) so far, parsed. */
  logs(): Record<string, unknown>[];
  /** What the process wrote to stderr (the newest 64 kB). */
  stderr(): string;
}

/** Starts the built daemon as a real process and waits until it listens (after its boot recovery). */
export async function spawnDaemon(options: {
  dataDir: string;
  databaseUrl: string;
  runtime?: object;
  /** Extra environment (provider settings, runner faults). */
  env?: Record<string, string>;
  logLevel?: string;
}): Promise<DaemonProcess> {
  if (!existsSync(built))
    throw new Error("build the daemon first (npx tsup in apps/daemon, or nx run @crw/daemon:build)");
  const child = spawn(process.execPath, [fixture], {
    env: {
      ...process.env,
      ...options.env,
      DATABASE_URL: options.databaseUrl,
      CRW_E2E_DAEMON: JSON.stringify({
        dataDir: options.dataDir,
        runtime: options.runtime,
        ...(options.logLevel && { logLevel: options.logLevel }),
      }),
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  child.stdout?.on("data", (d) => {
    // Bounded: only what the tests read (the newest megabyte).
    stdout = (stdout + d.toString()).slice(-1_000_000);
  });
  const logs = () =>
    stdout.split("\n").flatMap((line) => {
      try {
        return line.trim() ? [JSON.parse(line) as Record<string, unknown>] : [];
      } catch {
        return [];
      }
    });
  let stderr = "";
  child.stderr?.on("data", (d) => {
    stderr = (stderr + d.toString()).slice(-65_536);
  });
  let spawnError: Error | undefined;
  child.once("error", (e) => {
    spawnError = e;
  });
  const exited = new Promise<string>((r) => child.once("exit", (code, signal) => r(signal ?? String(code))));
  const until = Date.now() + 60_000;
  for (;;) {
    const state = await readState(options.dataDir);
    if (state && state.pid === child.pid) {
      const token = (await readFile(join(options.dataDir, "owner.token"), "utf8")).trim();
      return { child, url: state.url, token, exited, logs, stderr: () => stderr };
    }
    if (spawnError) throw new Error(`the daemon process could not start: ${spawnError.message}`);
    if (child.exitCode !== null || Date.now() > until)
      throw new Error(`the daemon did not come up (exit ${child.exitCode}): ${stderr.slice(-2000)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
