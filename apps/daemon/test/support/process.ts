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
}

/** Starts the built daemon as a real process and waits until it listens (after its boot recovery). */
export async function spawnDaemon(options: {
  dataDir: string;
  databaseUrl: string;
  runtime?: object;
}): Promise<DaemonProcess> {
  if (!existsSync(built))
    throw new Error("build the daemon first (npx tsup in apps/daemon, or nx run @crw/daemon:build)");
  const child = spawn(process.execPath, [fixture], {
    env: {
      ...process.env,
      DATABASE_URL: options.databaseUrl,
      CRW_E2E_DAEMON: JSON.stringify({ dataDir: options.dataDir, runtime: options.runtime }),
    },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  child.stderr?.on("data", (d) => {
    stderr += d.toString();
  });
  const exited = new Promise<string>((r) => child.once("exit", (code, signal) => r(signal ?? String(code))));
  const until = Date.now() + 60_000;
  for (;;) {
    const state = await readState(options.dataDir);
    if (state && state.pid === child.pid) {
      const token = (await readFile(join(options.dataDir, "owner.token"), "utf8")).trim();
      return { child, url: state.url, token, exited };
    }
    if (child.exitCode !== null || Date.now() > until)
      throw new Error(`the daemon did not come up (exit ${child.exitCode}): ${stderr.slice(-2000)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
