import { resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

/**
 * The brain tests as Stryker runs them (`npm run mutation`), inside its sandbox copy of the repo.
 * - `@crw/brain` resolves through node_modules to the real package, not to the sandbox's mutated copy: the
 *   alias points it at this directory's sources, so the test kit (`@crw/tools/delegation`) runs the same copy
 *   as the tests.
 * - Left out: suites that spawn processes running the built dist (they never see a mutant) and the fuzz and
 *   sandbox suites, which reach no settlement, delivery, recovery or capture code and take the longest.
 */
const base = crwVitest("brain", import.meta.dirname, { postgres: true });
const src = resolve(import.meta.dirname, "src");

export default defineConfig({
  ...base,
  resolve: {
    ...base.resolve,
    alias: [{ find: /^@crw\/brain$/, replacement: resolve(src, "index.ts") }],
  },
  test: {
    ...base.test,
    reporters: ["default"],
    exclude: [
      "**/node_modules/**",
      "test/delegation/crash.test.ts",
      "test/agent/sandbox.test.ts",
      "test/scope/fuzz-scope.test.ts",
    ],
  },
});
