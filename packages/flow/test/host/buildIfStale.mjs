#!/usr/bin/env node
// Builds packages/flow and apps/crw with tsup when a source is newer than its build. Run under
// `flock $TMPDIR/crw-flow-dist-build.lock` (see codexScenario.ts ensureBuilt): test files run in parallel
// and two tsup builds of one package (each cleaning dist/) must never overlap.
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { join, resolve } from "node:path";

const repoRoot = resolve(import.meta.dirname, "../../../..");
const newest = (dir) => {
  let latest = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, e.name);
    latest = Math.max(latest, e.isDirectory() ? newest(path) : statSync(path).mtimeMs);
  }
  return latest;
};
for (const pkg of ["packages/flow", "apps/crw"]) {
  const dist = join(repoRoot, pkg, "dist/index.js");
  if (!existsSync(dist) || statSync(dist).mtimeMs < newest(join(repoRoot, pkg, "src"))) {
    execFileSync("npx", ["tsup"], { cwd: join(repoRoot, pkg), stdio: "ignore" });
  }
}
