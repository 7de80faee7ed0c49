import { resolve } from "node:path";
import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

export default defineConfig(
  crwVitest("brain", import.meta.dirname, {
    postgres: true,
    setupFiles: [resolve(import.meta.dirname, "test/setup.ts")],
  }),
);
