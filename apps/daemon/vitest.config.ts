import { resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

// Two files at once: the daemon's files mostly wait on the daemon processes, databases and model servers
// they start (and on their backoffs and deadlines), and one after the other they made the longest project.
export default defineConfig(
  crwVitest("daemon", import.meta.dirname, {
    postgres: true,
    maxWorkers: 2,
    setupFiles: [resolve(import.meta.dirname, "test/setup.ts")],
  }),
);
