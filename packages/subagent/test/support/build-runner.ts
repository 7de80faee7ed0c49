import { execFileSync } from "node:child_process";
import { readdirSync, statSync } from "node:fs";
import { join, resolve } from "node:path";

const pkg = resolve(import.meta.dirname, "../..");

function newestSource(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestSource(path) : statSync(path).mtimeMs);
  }
  return newest;
}

/** Build dist/runner.js when any source is newer than it, so forked runners run the code under test. */
export default function setup(): void {
  let built = 0;
  try {
    built = statSync(join(pkg, "dist/runner.js")).mtimeMs;
  } catch {}
  if (built >= newestSource(join(pkg, "src"))) return;
  execFileSync("npx", ["tsup"], { cwd: pkg, stdio: "ignore" });
}
