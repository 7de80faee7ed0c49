import { resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

/**
 * The workflow plugin's tests as Stryker runs them (`npm run mutation`), inside its sandbox copy of the repo.
 * - `@crw/plugin-subagent` resolves through node_modules to the real package, not to the sandbox's mutated
 *   copy: the alias points it at this directory's sources.
 * - Left out: the SIGKILL suite (its processes run the built dist, which never sees a mutant), the
 *   definition fuzz suite, which reaches no run or recovery code, and the definition security suite: it
 *   times a pattern match against 100 ms, which the loaded machine of a mutation run misses (the dry run
 *   failed on it), and it tests definitions, not a run's dispatch, settlement or recovery.
 */
const base = crwVitest("plugin-subagent", import.meta.dirname, {
  postgres: true,
  isolate: true,
  setupFiles: [resolve(import.meta.dirname, "test/setup.ts")],
});
const src = resolve(import.meta.dirname, "src");

export default defineConfig({
  ...base,
  resolve: {
    ...base.resolve,
    alias: [{ find: /^@crw\/plugin-subagent$/, replacement: resolve(src, "index.ts") }],
  },
  test: {
    ...base.test,
    reporters: ["default"],
    exclude: [
      "**/node_modules/**",
      "test/crash.test.ts",
      "test/fuzz-definitions.test.ts",
      "test/definition-security.test.ts",
    ],
  },
});
