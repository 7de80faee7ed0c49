import { resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

/**
 * The runner pool's tests as Stryker runs them (`npm run mutation`), inside its sandbox copy of the repo.
 * - `@crw/subagent` resolves through node_modules to the real package, not to the sandbox's mutated copy:
 *   the alias points it at this directory's sources.
 * - No runner build (the normal config's globalSetup `test/support/build-runner.ts` reads ../brain/src and
 *   ../db/src, which the sandbox leaves out): the sandbox keeps this package's dist/ (`dist: true` in
 *   stryker.config.mjs), so `resolveRunnerEntry` finds dist/runner.js beside the sandbox's src/, a copy taken
 *   when the run starts (a rebuild of the real dist during the run does not change it). A forked runner never
 *   sees a mutant; the pool and the protocol checks that run in the test process do.
 */
const base = crwVitest("subagent", import.meta.dirname, {
  postgres: true,
  isolate: true,
  setupFiles: [resolve(import.meta.dirname, "test/setup.ts")],
});
/**
 * The pool's run (MUTATION_MODULE=subagent-pool, inherited by Stryker's test runners) runs the pool's own
 * suites, and the two others that alone reach a part of it: the reverse host-call handler (hostRpc) and the
 * provider-usage sink (providerUsage). Every suite that makes a pool covers pump and dispatch, and a
 * surviving mutant runs every test that covers it, each forking real runners: with all of them the run was
 * estimated at 1 h 30 min here.
 */
const poolSuites = [
  "test/pool.test.ts",
  "test/pool-*.test.ts",
  "test/startupEpisode.test.ts",
  "test/sinks.test.ts",
  "test/containment.test.ts",
  "test/hostRpc.test.ts",
  "test/providerUsage.test.ts",
];
const src = resolve(import.meta.dirname, "src");

export default defineConfig({
  ...base,
  resolve: {
    ...base.resolve,
    alias: [{ find: /^@crw\/subagent$/, replacement: resolve(src, "index.ts") }],
  },
  test: {
    ...base.test,
    ...(process.env.MUTATION_MODULE === "subagent-pool" && { include: poolSuites }),
    reporters: ["default"],
    // config.test.ts reads the sources' text for `process.env.X` (which variables they read): Stryker's
    // instrumented copy reads its own, so that test fails in the sandbox and can kill no mutant.
    exclude: ["**/node_modules/**", "test/config.test.ts"],
  },
});
