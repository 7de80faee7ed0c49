import { resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

const config = crwVitest("subagent", import.meta.dirname, {
  postgres: true,
  // A fresh process per file: its tests find and kill "the runners this process forked" in the process
  // table, which in a shared worker would include runners a previous file's pools are still closing.
  isolate: true,
  setupFiles: [resolve(import.meta.dirname, "test/setup.ts")],
});
// Runner tests fork the built runner (plain Node cannot run .ts): build it first when sources are newer.
config.test = {
  ...config.test,
  globalSetup: [
    ...((config.test?.globalSetup ?? []) as string[]),
    resolve(import.meta.dirname, "test/support/build-runner.ts"),
  ],
};
export default defineConfig(config);
