import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ownStart, pidAlive } from "../util/liveness.js";

/**
 * A private git index for one operation, in a directory of TMPDIR named by its process (pid and start):
 * a process killed while it held one cannot remove it, so the first private index a process makes first
 * removes those whose process is gone (an index is as large as the worktree's file list). A directory of
 * a live process, or of one whose name says nothing, is left alone.
 */
const PREFIX = "crw-index-";
const OWNED = /^crw-index-(\d+)-(\d+)-/;
let swept = false;
/** This process's own prefix: its pid and start do not change, so procfs is read once. */
let own: string | undefined;

export async function withPrivateIndex<T>(use: (env: { GIT_INDEX_FILE: string }) => Promise<T>): Promise<T> {
  const base = tmpdir();
  if (!swept) {
    swept = true;
    sweepDeadIndexes(base);
  }
  own ??= `${PREFIX}${process.pid}-${ownStart() ?? 0}-`;
  const dir = mkdtempSync(join(base, own));
  try {
    return await use({ GIT_INDEX_FILE: join(dir, "index") });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Removes the private index directories in `base` whose process is gone. */
function sweepDeadIndexes(base: string): void {
  let names: string[];
  try {
    names = readdirSync(base);
  } catch {
    return;
  }
  for (const name of names) {
    const owner = OWNED.exec(name);
    if (!owner) continue;
    const started = Number(owner[2]);
    if (pidAlive(Number(owner[1]), started === 0 ? undefined : started)) continue;
    rmSync(join(base, name), { recursive: true, force: true });
  }
}
