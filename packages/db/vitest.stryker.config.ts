import { resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

/**
 * The db tests as Stryker runs them (`npm run mutation`), inside its sandbox copy of the repo.
 * - `@crw/db` resolves through node_modules to the real package, not to the sandbox's mutated copy: the
 *   alias points it at this directory's sources, so the code that imports the package name (the test kit
 *   `@crw/tools/pg`, its global setup) runs the same copy as the tests. The global setup's migrate then reads
 *   the sandbox's `migrations/` (Stryker copies it for db).
 * - Left out: `test/embedded.test.ts` (about 35 s: it starts and kills real PostgreSQL servers, imports the
 *   built dist, and reaches no delegation code).
 */
const base = crwVitest("db", import.meta.dirname, { postgres: true, isolate: true });
const src = resolve(import.meta.dirname, "src");

export default defineConfig({
  ...base,
  resolve: {
    ...base.resolve,
    alias: [{ find: /^@crw\/db$/, replacement: resolve(src, "index.ts") }],
  },
  test: {
    ...base.test,
    reporters: ["default"],
    exclude: ["**/node_modules/**", "test/embedded.test.ts"],
  },
});
