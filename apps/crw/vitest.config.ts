import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

export default defineConfig(crwVitest("crw", import.meta.dirname, { maxWorkers: 2 }));
