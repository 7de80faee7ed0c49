import { resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

export default defineConfig(
  crwVitest("plugin-subagent", import.meta.dirname, {
    postgres: true,
    setupFiles: [resolve(import.meta.dirname, "test/setup.ts")],
  }),
);
