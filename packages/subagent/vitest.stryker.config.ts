import { resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

/**
 * The runner pool's tests as Stryker runs them (`npm run mutation`), inside its sandbox copy of the repo.
 * - `@crw/subagent` resolves through node_modules to the real package, not to the sandbox's mutated copy:
 *   the alias points it at this directory's sources.
 * - No runner build: the sandbox holds this package alone, and a forked runner runs the real package's
 *   dist/runner.js (built before the run), which never sees a mutant; the pool and the protocol checks that
 *   run in the test process do.
 */
const base = crwVitest("subagent", import.meta.dirname, { postgres: true });
const src = resolve(import.meta.dirname, "src");

export default defineConfig({
  ...base,
  resolve: {
    ...base.resolve,
    alias: [{ find: /^@crw\/subagent$/, replacement: resolve(src, "index.ts") }],
  },
  test: {
    ...base.test,
    reporters: ["default"],
    exclude: ["**/node_modules/**"],
  },
});
