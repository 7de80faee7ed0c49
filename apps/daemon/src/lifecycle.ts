import { chmod, lstat, mkdir, open, readFile, rename, rm, writeFile } from "node:fs/promises";
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

/** A path whose mode was wider than its owner's alone, and what it became. */
export interface NarrowedMode {
  readonly path: string;
  /** Octal text, e.g. "755". */
  readonly from: string;
  readonly to: string;
}

/**
 * The data directory holds work and tokens (the owner token, the database password, spilled results,
 * daemon.log with model output): it is created 0700, and an existing one (or an existing daemon.log or
 * spill directory) that is wider — made by an older crw, or by hand — is narrowed to 0700 / 0600. An
 * explicit chmod, not the mkdir mode alone: mkdir's mode applies only to a directory it creates, and is
 * masked by the umask. Symbolic links are left alone (chmod would follow them). Returns what it narrowed,
 * for the daemon to log.
 */
export async function privateDataDir(dataDir: string): Promise<NarrowedMode[]> {
  await mkdir(dataDir, { recursive: true, mode: 0o700 });
  const narrowed: NarrowedMode[] = [];
  const entries: [string, number][] = [
    [dataDir, 0o700],
    [join(dataDir, "daemon.log"), 0o600],
    [join(dataDir, "spill"), 0o700],
  ];
  for (const [path, mode] of entries) {
    const st = await lstat(path).catch(() => undefined);
    if (!st || st.isSymbolicLink() || (st.mode & 0o077) === 0) continue;
    await chmod(path, mode);
    narrowed.push({ path, from: (st.mode & 0o777).toString(8), to: mode.toString(8) });
  }
  return narrowed;
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
      const fh = await open(path, "wx", 0o600);
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
  await writeFile(tmp, `${JSON.stringify(state, null, 2)}\n`, { mode: 0o600 });
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
