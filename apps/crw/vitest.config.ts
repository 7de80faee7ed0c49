import { defineConfig } from "vitest/config";
import { crwVitest } from "../../tools/vitest/preset.ts";

// Two files at once: the crw project is the last one nx starts (it depends on every other), and its files
// mostly wait on the daemons and clients they spawn. Its tests run a dozen CLI commands against daemons
// that make their own PostgreSQL cluster: the longest take 20 s alone, and beside the flow suite on two
// cores half as long again, so their bound is 90 s.
export default defineConfig(crwVitest("crw", import.meta.dirname, { maxWorkers: 2, testTimeout: 90_000 }));
