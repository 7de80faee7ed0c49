// Shared flow bench setup: the TypeScript test kits (fake app-server, scripted owner, step source) bundled
// with esbuild into node_modules/.cache, then imported.
import { join } from "node:path";
import { build } from "esbuild";

export const repoRoot = new URL("../..", import.meta.url).pathname;

export async function loadFlowKits() {
  // inside the repository, so that the bundle's external imports resolve from its node_modules
  const outdir = join(repoRoot, "node_modules", ".cache", "crw-bench-flow-engine");
  await build({
    entryPoints: { kits: join(repoRoot, "bench/.flow-engine-kits.ts") },
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    outdir,
    external: ["@crw/flow", "ws", "zod"],
    logLevel: "error",
  });
  return import(join(outdir, "kits.js"));
}
