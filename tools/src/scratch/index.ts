import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const made: string[] = [];

/**
 * A new directory under the temporary directory, named `prefix` and six random characters, removed when the
 * test file's tests end (each project's test/setup.ts calls `removeScratchDirs`).
 */
export function scratchDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  made.push(dir);
  return dir;
}

/**
 * Removes the directories made since the last call (after each test file): files run one after another in
 * a worker that keeps this module, and the worker is stopped without an exit of its own, so nothing else
 * would. A process a test started that wrote its last file may still be exiting: a directory that fills
 * while it goes is tried again.
 */
export function removeScratchDirs(): void {
  for (const dir of made.splice(0)) rmSync(dir, { recursive: true, force: true, maxRetries: 5 });
}
