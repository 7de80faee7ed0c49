import { defineConfig } from "tsup";

export default defineConfig({
  entry: ["src/index.ts"],
  format: ["esm"],
  target: "node20",
  platform: "node",
  sourcemap: true,
  clean: true,
  // Dependencies load from node_modules at run time; only this package's own code is bundled.
  skipNodeModulesBundle: true,
});
