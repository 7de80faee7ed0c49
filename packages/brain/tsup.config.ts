import { defineConfig } from "tsup";
import { packageBuild } from "../../tools/build/tsup.ts";

export default defineConfig(
  packageBuild({
    entry: ["src/index.ts"],
    // The agent loop's libraries are imported on a child turn's first use: they stay in chunks of their own.
    splitting: true,
    // No clean: a process that started before a rebuild imports those chunks later, from the build it
    // started with; a rebuild that deleted dist/ first would pull them from under it.
    clean: false,
  }),
);
