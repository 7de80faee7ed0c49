import { existsSync } from "node:fs";
import { readFile, readlink, realpath, rm } from "node:fs/promises";
import { join } from "node:path";

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
};

/** The pid, port and socket directory a `postmaster.pid` names, or undefined when it is missing or unreadable. */
async function lockFile(
  dataDir: string,
): Promise<{ pid: number; port: number; socketDir: string | null } | undefined> {
  let text: string;
  try {
    text = await readFile(join(dataDir, "postmaster.pid"), "utf8");
  } catch {
    return undefined;
  }
  const lines = text.split("\n");
  const pid = Number(lines[0]);
  const port = Number(lines[3]);
  if (!Number.isInteger(pid) || pid <= 0 || !Number.isInteger(port) || port <= 0) return undefined;
  return { pid, port, socketDir: lines[4]?.trim() || null };
}

/**
 * Whether `pid` is the postmaster of `dataDir`. A `postmaster.pid` outlives its server when the server or the
 * machine was killed, and its pid may since belong to any process (after a reboot most likely): a live pid
 * alone is no postmaster. A postmaster works in its data directory, so on Linux its working directory tells;
 * one that cannot be read is another user's process (the server runs as the caller, or as the server user,
 * whose processes root reads). Without /proc a live pid is taken for the postmaster.
 */
async function isPostmasterOf(pid: number, dataDir: string): Promise<boolean> {
  if (!alive(pid)) return false;
  let cwd: string;
  try {
    cwd = await readlink(`/proc/${pid}/cwd`);
  } catch {
    return !existsSync("/proc/self");
  }
  return cwd === (await realpath(dataDir).catch(() => dataDir));
}

/**
 * The postmaster that runs on `dataDir`, from its `postmaster.pid` (pid on line 1, port on line 4, the
 * Unix socket's directory on line 5, empty when it listens on TCP alone): a cluster whose owner died
 * without stopping it (SIGKILL runs no cleanup).
 */
export async function runningPostmaster(
  dataDir: string,
): Promise<{ pid: number; port: number; socketDir: string | null } | undefined> {
  const lock = await lockFile(dataDir);
  return lock && (await isPostmasterOf(lock.pid, dataDir)) ? lock : undefined;
}

/**
 * Removes a `postmaster.pid` whose pid is not the postmaster of `dataDir`: PostgreSQL refuses to start while
 * the pid its lock file names is alive, whatever process has it now. True when one was removed.
 */
export async function clearStaleLock(dataDir: string): Promise<boolean> {
  const lock = await lockFile(dataDir);
  if (!lock || (await isPostmasterOf(lock.pid, dataDir))) return false;
  await rm(join(dataDir, "postmaster.pid"), { force: true });
  return true;
}

/**
 * Fast shutdown of the postmaster `pid` of `dataDir` (sessions aborted, checkpoint, exit), waiting up to `ms`
 * for it. A pid that is no longer that postmaster is left alone: it may be anyone's by now.
 */
export async function stopPostmaster(pid: number, dataDir: string, ms = 30_000): Promise<void> {
  if (!(await isPostmasterOf(pid, dataDir))) return;
  process.kill(pid, "SIGINT");
  const until = Date.now() + ms;
  while (alive(pid) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
}
