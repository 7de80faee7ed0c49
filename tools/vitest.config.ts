import { resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "./vitest/preset.ts";

// Two files at once: the README-commands tests are minutes each of installing and building in a clone,
// mostly waiting on child processes.
export default defineConfig(
  crwVitest("tools", import.meta.dirname, {
    postgres: true,
    maxWorkers: 2,
    setupFiles: [resolve(import.meta.dirname, "test/setup.ts")],
  }),
);
