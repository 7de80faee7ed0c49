import { resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

// Two files at once: flow's suite is the longest and, started after the packages it depends on, the last
// one running; its files mostly wait on the run processes and hosts they spawn.
export default defineConfig(
  crwVitest("flow", import.meta.dirname, {
    maxWorkers: 2,
    setupFiles: [resolve(import.meta.dirname, "test/setup.ts")],
  }),
);
