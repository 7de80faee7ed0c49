import { defineConfig } from "tsup";

export default defineConfig({
  // runner.ts is the forked runner process (RUNNER_ENTRY); it is built beside index.js.
  entry: ["src/index.ts", "src/runner.ts"],
  format: ["esm"],
  target: "node20",
  platform: "node",
  sourcemap: true,
  clean: true,
  // Dependencies load from node_modules at run time; only this package's own code is bundled.
  skipNodeModulesBundle: true,
  // Each entry self-contained: a runner's build identity is the digest of its one file.
  splitting: false,
  // Built code resolves sibling packages through their dist, so the source condition stays off here.
  dts: { entry: ["src/index.ts"], compilerOptions: { ignoreDeprecations: "6.0", customConditions: [] } },
});
