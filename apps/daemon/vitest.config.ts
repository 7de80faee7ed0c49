import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

export default defineConfig(crwVitest("daemon", import.meta.dirname, { postgres: true }));
