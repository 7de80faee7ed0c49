import { defineConfig } from "vitest/config";
import { crwVitest } from "./vitest/preset.ts";

export default defineConfig(crwVitest("tools", import.meta.dirname, { postgres: true }));
