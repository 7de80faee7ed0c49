import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

// Two files at once: the crw project is the last one nx starts (it depends on every other), and its files
// mostly wait on the daemons and clients they spawn.
export default defineConfig(crwVitest("crw", import.meta.dirname, { maxWorkers: 2 }));
