import { defineConfig } from "tsup";

export default defineConfig({
  entry: ["src/index.ts"],
  format: ["esm"],
  target: "node20",
  platform: "node",
  sourcemap: true,
  clean: true,
  // Built code resolves sibling packages through their dist, so the source condition stays off here.
  dts: { compilerOptions: { ignoreDeprecations: "6.0", customConditions: [] } },
});
