import { readdirSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { build, type Options } from "tsup";

const pkg = resolve(import.meta.dirname, "../..");

function newest(dir: string): number {
  let at = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    at = Math.max(at, entry.isDirectory() ? newest(path) : statSync(path).mtimeMs);
  }
  return at;
}

/**
 * Build dist/runner.js (only the runner entry of tsup.config.ts, no declarations) when a source it bundles
 * is newer, so forked runners run the code under test.
 */
export default async function setup(): Promise<void> {
  let built = 0;
  try {
    built = statSync(join(pkg, "dist/runner.js")).mtimeMs;
  } catch {}
  const sources = Math.max(
    newest(join(pkg, "src")),
    newest(join(pkg, "../brain/src")),
    newest(join(pkg, "../db/src")),
    statSync(join(pkg, "tsup.config.ts")).mtimeMs,
  );
  if (built >= sources) return;
  const configs = (await import(join(pkg, "tsup.config.ts"))).default as Options[];
  const runner = configs.find((c) => JSON.stringify(c.entry).includes("runner"));
  if (!runner) throw new Error("tsup.config.ts has no runner build");
  const cwd = process.cwd();
  process.chdir(pkg);
  try {
    await build({ ...runner, config: false, silent: true });
  } finally {
    process.chdir(cwd);
  }
}
