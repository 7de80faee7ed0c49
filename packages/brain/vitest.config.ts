import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

export default defineConfig(crwVitest("brain", import.meta.dirname, { postgres: true }));
