// Shared flow bench setup: the TypeScript test kits (fake app-server, scripted owner, step source) bundled
// with esbuild into node_modules/.cache, then imported.
import { mkdirSync } from "node:fs";
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

/**
 * Writes the run directory and run.json of a session-backend run `runId` under `root`/state, its owner a
 * thread of the fake app-server `fake` and its repository `root`. `extra` adds or overrides spec fields.
 */
export function writeSessionRun(flow, { root, runId, fake, owner, pool, extra = {} }) {
  const paths = flow.runPaths(join(root, "state"), runId);
  mkdirSync(paths.dir, { recursive: true });
  const spec = {
    format: flow.SPEC_FORMAT,
    run_id: runId,
    workflow: join(root, "w.mjs"),
    workflow_name: runId,
    input: null,
    backend: "session",
    owner,
    pool,
    repo: root,
    host: fake.url,
    created_at: new Date().toISOString(),
    ...extra,
  };
  flow.writeSpec(paths.spec, spec);
  return { paths, spec };
}
