import { existsSync } from "node:fs";
import { delimiter, join, resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

/**
 * The brain tests as Stryker runs them (`npm run mutation`), inside its sandbox copy of the repo.
 * - `@crw/brain` resolves through node_modules to the real package, not to the sandbox's mutated copy: the
 *   alias points it at this directory's sources, so the test kit (`@crw/tools/delegation`) runs the same copy
 *   as the tests.
 * - Left out: suites that spawn processes running the built dist (they never see a mutant) and the fuzz and
 *   sandbox suites, which reach no settlement, delivery, recovery or capture code and take the longest.
 * - Left out: `test/delegation/turns-doc.test.ts` reads docs/modules/brain/turns.md, which the sandbox
 *   (only package.json, tools/, migrations/ and packages/brain/) does not hold.
 * - Left out where bubblewrap (`bwrap`, or `CRW_BWRAP`) is missing: `test/agent/turn.test.ts` and
 *   `test/agent/tool-guards.test.ts` run real shell commands, which never run outside it.
 */
const base = crwVitest("brain", import.meta.dirname, {
  postgres: true,
  isolate: true,
  setupFiles: [resolve(import.meta.dirname, "test/setup.ts")],
});
const src = resolve(import.meta.dirname, "src");
// The shell tool runs only inside bubblewrap: without it these suites fail in the dry run, before any mutant.
const bwrap =
  Boolean(process.env.CRW_BWRAP) ||
  (process.env.PATH ?? "").split(delimiter).some((d) => d && existsSync(join(d, "bwrap")));

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
      "test/delegation/turns-doc.test.ts",
      ...(bwrap ? [] : ["test/agent/turn.test.ts", "test/agent/tool-guards.test.ts"]),
    ],
  },
});
