import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

export default defineConfig(crwVitest("plugin-subagent", import.meta.dirname, { postgres: true }));
