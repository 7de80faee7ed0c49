#!/usr/bin/env node
// Builds packages/flow and apps/crw with tsup when a source is newer than its build. Run under
// `flock $TMPDIR/crw-flow-dist-build.lock` (see codexScenario.ts ensureBuilt): test files run in parallel
// and two tsup builds of one package (each cleaning dist/) must never overlap.
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, realpathSync, statSync } from "node:fs";
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
// The packages as the spawned CLI finds them, through node_modules: in a copy of the tree that holds
// packages/flow alone (a mutation run's sandbox) they are the checkout's own.
for (const name of ["flow", "cli"]) {
  const pkg = realpathSync(join(repoRoot, "node_modules/@crw", name));
  const dist = join(pkg, "dist/index.js");
  if (!existsSync(dist) || statSync(dist).mtimeMs < newest(join(pkg, "src"))) {
    execFileSync("npx", ["tsup"], { cwd: pkg, stdio: "ignore" });
  }
}
