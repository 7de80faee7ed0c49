import { randomBytes } from "node:crypto";
import { closeSync, existsSync, openSync, readdirSync, readFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { removeIfExists } from "../util/fsx.js";

/**
 * File locks of a run: start.lock (held by a start from before it binds until its process holds the run
 * lock), run.lock (held by the process that runs the run) and process.<token>.lock (each run process's
 * own, named by its started row). A lock file holds the holder's pid; a lock is held while the file
 * exists and its pid is alive. A file whose pid is dead is a lock let go: SIGKILL runs no cleanup, so
 * the truth is the pid, never a file's mere presence.
 */
export interface LockInfo {
  pid: number;
  token?: string;
}

/**
 * Whether `pid` runs. A zombie (a process that exited and that its parent has not reaped yet: a run
 * process SIGKILLed under an init that reaps late) does not, though `kill(pid, 0)` still succeeds on it:
 * where there is a procfs its state says which.
 */
export function pidAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
  return !exited(pid);
}

const procfs = existsSync("/proc/self/stat");

function exited(pid: number): boolean {
  if (!procfs) return false;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 1).trim()[0];
    return state === "Z" || state === "X";
  } catch {
    return true; // gone between the two looks
  }
}

export function readLock(path: string): LockInfo | null {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch {
    return null;
  }
  try {
    const v = JSON.parse(text) as { pid?: unknown; token?: unknown };
    if (typeof v.pid !== "number") return null;
    return typeof v.token === "string" ? { pid: v.pid, token: v.token } : { pid: v.pid };
  } catch {
    return null;
  }
}

/** The lock's holder when one is alive, else null. */
export function lockHolder(path: string): LockInfo | null {
  const info = readLock(path);
  return info && pidAlive(info.pid) ? info : null;
}

/**
 * Takes a lock for `pid` (this process by default). A file left by a dead pid is taken over. Answers
 * false when a live holder has it.
 */
export function tryLock(path: string, info: LockInfo = { pid: process.pid }): boolean {
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
      if (holder && pidAlive(holder.pid)) return holder.pid === info.pid && holder.token === info.token;
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
