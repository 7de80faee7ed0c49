import { mkdir, open, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";

/** What a running daemon publishes about itself in `<dataDir>/daemon.state.json` (written once listening). */
export interface DaemonState {
  pid: number;
  host: string;
  port: number;
  url: string;
  startedAt: string;
  database: "external" | "embedded" | "adopted";
}

export class DaemonLockedError extends Error {
  override readonly name = "DaemonLockedError";
  readonly code = "daemon_running";
  readonly retryable = false;
  constructor(
    readonly dataDir: string,
    readonly pid: number,
  ) {
    super(`a daemon (pid ${pid}) already runs on ${dataDir}; stop it with 'crw daemon stop' first`);
  }
}

export const lockPath = (dataDir: string) => join(dataDir, "daemon.lock");
export const statePath = (dataDir: string) => join(dataDir, "daemon.state.json");

export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * One daemon per data directory: the lock file is created exclusively and names its pid. A lock whose pid
 * no longer runs was left by a daemon that died (SIGKILL runs no cleanup) and is taken over.
 */
export async function lockDataDir(dataDir: string): Promise<() => Promise<void>> {
  // The data directory holds the owner token and the database password: the invoking user's alone.
  await mkdir(dataDir, { recursive: true, mode: 0o700 });
  const path = lockPath(dataDir);
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const fh = await open(path, "wx");
      await fh.writeFile(`${process.pid}\n`);
      await fh.sync();
      await fh.close();
      return async () => {
        const owner = Number((await readFile(path, "utf8").catch(() => "")).trim());
        if (owner === process.pid) await rm(path, { force: true });
      };
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
      const pid = Number((await readFile(path, "utf8").catch(() => "")).trim());
      if (Number.isInteger(pid) && pid > 0 && processAlive(pid)) throw new DaemonLockedError(dataDir, pid);
      await rm(path, { force: true });
    }
  }
  throw new Error(`could not take ${path}`);
}

export async function writeState(dataDir: string, state: DaemonState): Promise<void> {
  const path = statePath(dataDir);
  const tmp = `${path}.${process.pid}.tmp`;
  await writeFile(tmp, `${JSON.stringify(state, null, 2)}\n`);
  await rename(tmp, path);
}

/** The state of the daemon that runs on `dataDir`, or undefined when none runs (a stale file is ignored). */
export async function readState(dataDir: string): Promise<DaemonState | undefined> {
  try {
    const state = JSON.parse(await readFile(statePath(dataDir), "utf8")) as DaemonState;
    return processAlive(state.pid) ? state : undefined;
  } catch {
    return undefined;
  }
}

export async function removeState(dataDir: string): Promise<void> {
  const state = await readState(dataDir);
  if (!state || state.pid === process.pid) await rm(statePath(dataDir), { force: true });
}
