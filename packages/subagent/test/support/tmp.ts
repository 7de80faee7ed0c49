import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const made: string[] = [];

/** A scratch directory removed after the test file. Call inside a test or a hook of a file that imports this. */
export function tempDir(label: string): string {
  const dir = mkdtempSync(join(tmpdir(), `crw-subagent-${label}-`));
  made.push(dir);
  return dir;
}

/** Removes the directories made since the last call (test/setup.ts, after each test file). */
export function removeTempDirs(): void {
  for (const dir of made.splice(0)) rmSync(dir, { recursive: true, force: true });
}
