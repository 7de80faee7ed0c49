import { randomBytes } from "node:crypto";
import { closeSync, openSync, readdirSync, readFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { removeIfExists } from "../util/fsx.js";
import { ownStart, pidAlive } from "../util/liveness.js";

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
