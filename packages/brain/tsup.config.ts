import { defineConfig } from "tsup";
import { inlinedDependencies } from "../../tools/build/inlined.ts";

export default defineConfig({
  entry: ["src/index.ts"],
  format: ["esm"],
  target: "node20",
  platform: "node",
  sourcemap: true,
  clean: true,
  // Dependencies load from node_modules at run time, except those inlined (see there); the agent loop's
  // libraries are imported on a child turn's first use, so they stay in chunks of their own.
  skipNodeModulesBundle: true,
  noExternal: inlinedDependencies,
  splitting: true,
});
