import { defineConfig } from "tsup";
import { packageBuild } from "../../tools/build/tsup.ts";

export default defineConfig(
  packageBuild({
    entry: ["src/index.ts"],
    clean: true,
    // The agent loop's libraries are imported on a child turn's first use: they stay in chunks of their own.
    splitting: true,
  }),
);
