import { defineConfig } from "tsup";
import { packageBuild } from "../../tools/build/tsup.ts";

export default defineConfig(
  packageBuild({
    entry: { index: "src/index.ts", "cli/index": "src/cli/index.ts" },
    // Split chunks: the owner's per-step commands load their own small chunks, not the engine or zod.
    splitting: true,
    // No clean: run processes and CLI commands of a shared checkout load chunks of the build they started
    // with; a rebuild that deleted dist/ first would pull those chunks from under them.
    clean: false,
  }),
);
