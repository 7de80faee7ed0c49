import { resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

/**
 * The flow tests as Stryker runs them (`npm run mutation`), inside its sandbox copy of the repo.
 * - `@crw/flow` resolves through node_modules to the real package, not to the sandbox's mutated copy: the
 *   alias points it at this directory's sources, so the tests that import the package see the mutants.
 * - Left out: the suites that drive the real `codex` binary, and those that take more than 20 s (crash
 *   tests with spawned processes, whose children run the built dist and never see a mutant anyway).
 */
const base = crwVitest("flow", import.meta.dirname, {
  isolate: true,
  setupFiles: [resolve(import.meta.dirname, "test/setup.ts")],
});
const src = resolve(import.meta.dirname, "src");

export default defineConfig({
  ...base,
  resolve: {
    ...base.resolve,
    alias: [
      { find: /^@crw\/flow$/, replacement: resolve(src, "index.ts") },
      { find: /^@crw\/flow\/cli$/, replacement: resolve(src, "cli/index.ts") },
    ],
  },
  test: {
    ...base.test,
    reporters: ["default"],
    exclude: [
      "**/node_modules/**",
      "test/host/e2e-codex*.test.ts",
      "test/host/realCodex*.test.ts",
      "test/backends/*.e2e.test.ts",
      "test/crash.test.ts",
      "test/ownerRefusals.test.ts",
      "test/git/branchCrash.test.ts",
      // real CLI processes under a umask of their own: a worker thread cannot set one
      "test/cli.test.ts",
    ],
  },
});
