import { randomBytes } from "node:crypto";
import { closeSync, linkSync, openSync, readFileSync, renameSync, unlinkSync, writeSync } from "node:fs";
import { join } from "node:path";
import { ownStart, pidAlive } from "../util/liveness.js";
import { BoundError } from "./errors.js";

/**
 * The lock of the flow-bound directory: `<dir>/.lock`, a file made with link(2) from a temporary file that
 * already holds the holder's pid, so a lock file is never seen empty. Held for the few milliseconds of a
 * read of a thread's last line and its append, so two near-simultaneous binds of one thread (two starts,
 * or their two run processes) are one after the other. A file whose pid is dead is a lock let go (SIGKILL
 * runs no cleanup): it is moved aside under a unique name and removed only when the moved file is still
 * the dead holder's, so a lock taken in between is put back, never lost.
 */
const LOCK_NAME = ".lock";
const sleeper = new Int32Array(new SharedArrayBuffer(4));

function sleepSync(ms: number): void {
  Atomics.wait(sleeper, 0, 0, ms);
}

function holderOf(path: string): { pid: number; nonce: string; started?: number } | null {
  try {
    const v = JSON.parse(readFileSync(path, "utf8")) as { pid?: unknown; nonce?: unknown; started?: unknown };
    if (typeof v.pid !== "number") return null;
    const nonce = String(v.nonce ?? "");
    return typeof v.started === "number" ? { pid: v.pid, nonce, started: v.started } : { pid: v.pid, nonce };
  } catch {
    return null;
  }
}

function tryTake(path: string, nonce: string): boolean {
  const tmp = `${path}.${process.pid}.${nonce}`;
  const fd = openSync(tmp, "wx", 0o600);
  try {
    writeSync(fd, JSON.stringify({ pid: process.pid, nonce, started: ownStart() }));
  } finally {
    closeSync(fd);
  }
  try {
    linkSync(tmp, path);
    return true;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
    return false;
  } finally {
    unlinkSync(tmp);
  }
}

function breakIfDead(path: string): void {
  const holder = holderOf(path);
  if (holder === null || pidAlive(holder.pid, holder.started)) return;
  const aside = `${path}.stale.${randomBytes(4).toString("hex")}`;
  try {
    renameSync(path, aside);
  } catch {
    return;
  }
  const moved = holderOf(aside);
  if (moved && moved.nonce !== holder.nonce && pidAlive(moved.pid, moved.started)) {
    // a live holder took the lock between the read and the rename: give it back
    try {
      linkSync(aside, path);
    } catch {
      // someone else holds it now; the live holder's own unlock will find its nonce gone
    }
  }
  unlinkSync(aside);
}

/** Runs `fn` holding the flow-bound directory lock; `lock_timeout` when it stays held past `timeoutMs`. */
export function withDirLock<T>(dir: string, fn: () => T, timeoutMs = 10_000): T {
  const path = join(dir, LOCK_NAME);
  const nonce = randomBytes(6).toString("hex");
  const deadline = Date.now() + timeoutMs;
  let wait = 1;
  while (!tryTake(path, nonce)) {
    breakIfDead(path);
    if (Date.now() > deadline)
      throw new BoundError("lock_timeout", `the flow-bound lock ${path} stays held`, {
        holder: holderOf(path),
      });
    sleepSync(wait);
    wait = Math.min(wait * 2, 25);
  }
  try {
    return fn();
  } finally {
    if (holderOf(path)?.nonce === nonce) unlinkSync(path);
  }
}
