import { chmod, lstat, mkdir, open, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { z } from "zod";
import { type Liveness, ownStartTime, processLiveness } from "./processIdentity.js";

/** What a running daemon publishes about itself in `<dataDir>/daemon.state.json` (written once listening). */
export interface DaemonState {
  pid: number;
  host: string;
  port: number;
  url: string;
  startedAt: string;
  database: "external" | "embedded" | "adopted";
  /**
   * The process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22), added by `writeState`
   * where procfs exists: with it a reader tells the daemon from an unrelated process that got its pid.
   * Files written by an older crw lack it.
   */
  processStartTime?: number;
}

/** A state file read back with what became of its process (for `crw daemon start|status` to explain). */
export interface RecordedDaemon extends DaemonState {
  readonly liveness: Liveness;
}

const daemonStateFile = z.object({
  pid: z.number().int().positive(),
  host: z.string(),
  port: z.number().int().min(0).max(65_535),
  url: z.string(),
  startedAt: z.string(),
  database: z.enum(["external", "embedded", "adopted"]),
  processStartTime: z.number().int().nonnegative().optional(),
});

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

/**
 * Whether `pid` still runs as the process recorded: a zombie, or (given the recorded start time) a pid now
 * used by another process, is not alive. Where procfs is absent this is `kill(pid, 0)`.
 */
export function processAlive(pid: number, recordedStartTime?: number): boolean {
  return processLiveness(pid, recordedStartTime) === "alive";
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

/** What `daemon.lock` holds: the pid on the first line, its start time (when known) on the second. */
interface LockOwner {
  readonly pid: number;
  readonly startTime?: number;
}

function lockText(): string {
  const startTime = ownStartTime();
  return startTime === undefined ? `${process.pid}\n` : `${process.pid}\n${startTime}\n`;
}

/** A lock file's owner; a lock with only a pid (an older crw) has no start time. */
export function parseLock(text: string): LockOwner | undefined {
  const [pidLine = "", startLine = ""] = text.split("\n").map((l) => l.trim());
  const pid = Number(pidLine);
  if (!Number.isSafeInteger(pid) || pid <= 0) return undefined;
  const startTime = startLine === "" ? Number.NaN : Number(startLine);
  return Number.isSafeInteger(startTime) && startTime >= 0 ? { pid, startTime } : { pid };
}

/**
 * Whether a lock's owner still holds it. Our own pid is no exception: another daemon in this process (an
 * embedder) holds it with our start time, while a lock from an earlier container run, where pids repeat,
 * names our pid with another start time (a reused pid).
 */
function lockHeld(owner: LockOwner | undefined): owner is LockOwner {
  return owner !== undefined && processAlive(owner.pid, owner.startTime);
}

/**
 * One daemon per data directory: the lock file is created exclusively and names its pid and start time. A
 * lock whose process no longer runs was left by a daemon that died (SIGKILL runs no cleanup) and is taken
 * over; so is one whose pid is a zombie (an init that does not reap) or now names another process.
 */
export async function lockDataDir(dataDir: string): Promise<() => Promise<void>> {
  // The data directory holds the owner token and the database password: the invoking user's alone.
  await mkdir(dataDir, { recursive: true, mode: 0o700 });
  const path = lockPath(dataDir);
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const fh = await open(path, "wx", 0o600);
      await fh.writeFile(lockText());
      await fh.sync();
      await fh.close();
      return async () => {
        const owner = parseLock(await readFile(path, "utf8").catch(() => ""));
        if (owner?.pid === process.pid) await rm(path, { force: true });
      };
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
      const owner = parseLock(await readFile(path, "utf8").catch(() => ""));
      if (lockHeld(owner)) throw new DaemonLockedError(dataDir, owner.pid);
      await rm(path, { force: true });
    }
  }
  throw new Error(`could not take ${path}`);
}

/** Writes the state file atomically; this process's own state gets its start time. */
export async function writeState(dataDir: string, state: DaemonState): Promise<void> {
  const path = statePath(dataDir);
  const tmp = `${path}.${process.pid}.tmp`;
  const startTime = state.pid === process.pid ? ownStartTime() : undefined;
  const recorded = startTime === undefined ? state : { ...state, processStartTime: startTime };
  await writeFile(tmp, `${JSON.stringify(recorded, null, 2)}\n`, { mode: 0o600 });
  await rename(tmp, path);
}

async function readRecorded(dataDir: string): Promise<RecordedDaemon | undefined> {
  let text: string;
  try {
    text = await readFile(statePath(dataDir), "utf8");
  } catch {
    return undefined;
  }
  let state: DaemonState;
  try {
    state = daemonStateFile.parse(JSON.parse(text));
  } catch {
    // A torn or foreign file names no process to ask about: as good as none.
    return undefined;
  }
  return { ...state, liveness: processLiveness(state.pid, state.processStartTime) };
}

/** The state of the daemon that runs on `dataDir`, or undefined when none runs (a stale file is ignored). */
export async function readState(dataDir: string): Promise<DaemonState | undefined>;
/**
 * With `includeDead`: the recorded state whatever became of its process, with its `liveness`, so a caller can
 * say why no daemon runs (a zombie, a reused pid, gone). Undefined only when there is no readable state file.
 */
export async function readState(
  dataDir: string,
  options: { includeDead: true },
): Promise<RecordedDaemon | undefined>;
export async function readState(
  dataDir: string,
  options: { includeDead?: boolean } = {},
): Promise<RecordedDaemon | DaemonState | undefined> {
  const recorded = await readRecorded(dataDir);
  if (!recorded) return undefined;
  if (options.includeDead) return recorded;
  if (recorded.liveness !== "alive") return undefined;
  const { liveness: _, ...state } = recorded;
  return state;
}

export async function removeState(dataDir: string): Promise<void> {
  const state = await readState(dataDir);
  if (!state || state.pid === process.pid) await rm(statePath(dataDir), { force: true });
}
