import { randomBytes } from "node:crypto";
import { closeSync, existsSync, openSync, readdirSync, readFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { removeIfExists } from "../util/fsx.js";

/**
 * File locks of a run: start.lock (held by a start from before it binds until its process holds the run
 * lock), run.lock (held by the process that runs the run) and process.<token>.lock (each run process's
 * own, named by its started row). A lock file holds the holder's pid and, where there is a procfs, when
 * that process started; a lock is held while the file exists and that process is alive. A file whose
 * process is gone is a lock let go: SIGKILL runs no cleanup, so the truth is the process, never a file's
 * mere presence.
 */
export interface LockInfo {
  pid: number;
  token?: string;
  /** The holder's start (clock ticks since boot): with the pid it names one process, not whoever has the pid now. */
  started?: number;
}

/**
 * Whether `pid` runs, and when `started` is given, is still the process that started then: a pid is handed
 * out again (after a restart, most likely), and a lock left by a killed machine must not be held by
 * whichever process has its pid now. A zombie (a process that exited and that its parent has not reaped
 * yet: a run process SIGKILLed under an init that reaps late) does not run, though `kill(pid, 0)` still
 * succeeds on it: where there is a procfs its state says which.
 */
export function pidAlive(pid: number, started?: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
  } catch (e) {
    // EPERM: another user's process has the pid; its procfs entry says whether it is the holder
    if ((e as NodeJS.ErrnoException).code !== "EPERM") return false;
  }
  if (!procfs) return true;
  const stat = procStat(pid);
  // gone between the two looks, exited, or another process under the same pid
  if (!stat || stat.state === "Z" || stat.state === "X") return false;
  return started === undefined || stat.started === started;
}

const procfs = existsSync("/proc/self/stat");

/** Fields 3 (state) and 22 (start, in clock ticks since boot) of `/proc/<pid>/stat`. */
function procStat(pid: number | "self"): { state: string; started: number } | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // the command name (field 2) may hold spaces and parentheses: the fixed fields follow the last ")"
    const fields = stat
      .slice(stat.lastIndexOf(")") + 1)
      .trim()
      .split(/\s+/);
    return { state: fields[0] ?? "", started: Number(fields[22 - 3]) };
  } catch {
    return undefined;
  }
}

/** This process's start for its lock files; undefined without a procfs. */
export function ownStart(): number | undefined {
  return procfs ? procStat("self")?.started : undefined;
}

export function readLock(path: string): LockInfo | null {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch {
    return null;
  }
  try {
    const v = JSON.parse(text) as { pid?: unknown; token?: unknown; started?: unknown };
    if (typeof v.pid !== "number") return null;
    return {
      pid: v.pid,
      ...(typeof v.token === "string" ? { token: v.token } : {}),
      ...(typeof v.started === "number" ? { started: v.started } : {}),
    };
  } catch {
    return null;
  }
}

/** The lock's holder when one is alive, else null. */
export function lockHolder(path: string): LockInfo | null {
  const info = readLock(path);
  return info && pidAlive(info.pid, info.started) ? info : null;
}

/**
 * Takes a lock for `pid` (this process by default). A file left by a dead pid is taken over. Answers
 * false when a live holder has it.
 */
export function tryLock(path: string, lock: LockInfo = { pid: process.pid }): boolean {
  const started = lock.pid === process.pid ? ownStart() : undefined;
  const info = started === undefined ? lock : { ...lock, started };
  for (let i = 0; i < 3; i++) {
    try {
      const fd = openSync(path, "wx");
      try {
        writeSync(fd, JSON.stringify(info));
      } finally {
        closeSync(fd);
      }
      return readLock(path)?.pid === info.pid;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
      const holder = readLock(path);
      if (holder && pidAlive(holder.pid, holder.started))
        return holder.pid === info.pid && holder.token === info.token;
      removeIfExists(path);
    }
  }
  return false;
}

export function unlock(path: string, pid: number = process.pid): void {
  const info = readLock(path);
  if (info && info.pid === pid) removeIfExists(path);
}

export function newToken(): string {
  return randomBytes(6).toString("hex");
}

/** The process locks of a run whose pid is alive, by token. */
export function heldProcessLocks(runDir: string): Map<string, LockInfo> {
  const held = new Map<string, LockInfo>();
  let names: string[];
  try {
    names = readdirSync(runDir);
  } catch {
    return held;
  }
  for (const name of names) {
    const m = /^process\.([0-9a-f]+)\.lock$/.exec(name);
    if (!m?.[1]) continue;
    const info = lockHolder(join(runDir, name));
    if (info) held.set(m[1], info);
  }
  return held;
}
