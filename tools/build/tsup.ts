import type { Plugin } from "esbuild";
import type { Options } from "tsup";

/**
 * Third-party modules bundled into crw's builds instead of loaded from node_modules at run time.
 *
 * The agent loop's libraries ship as hundreds of small ES modules (typebox alone is about 700 files), and
 * a process pays to resolve, read and compile each one: importing them from node_modules cost about half a
 * second of CPU, bundled about 60 ms. Every process that runs a model turn pays it once (a crw flow run
 * process, a runner's first turn). Only @crw/brain imports them, so each build that carries the brain (its
 * own, and the runner's) holds the one copy its process loads; pi-ai keeps registries at module level, so
 * pi-agent-core must reach the same copy, which it does when both are bundled together.
 *
 * The vendor SDKs behind pi-ai's providers stay in node_modules: pi-ai imports each on first use only, now
 * from the bundle's place, so they must stay where npm hoists them (no version of ours that differs from
 * pi-ai's). Its Bedrock provider, loaded by a computed path, is left out of the bundle and cannot load from
 * it: crw offers no Bedrock API.
 */
export const inlinedDependencies: RegExp[] = [/^typebox(\/|$)/, /^@mariozechner\/pi-(ai|agent-core)(\/|$)/];

/** zod and its subpaths: bundled where a build carries its own copy (@crw/db's shared one, the runner's). */
export const zodModules = /^zod(\/|$)/;

/**
 * Points a build's `zod` imports at `@crw/db/zod`, @crw/db's bundled copy of zod: one file instead of zod's
 * ~95 modules, and one copy for crw's code however many of crw's packages the process loads (a copy bundled
 * into each package's build would load once per package). A library that imports zod itself (the MCP SDK)
 * still loads its own from node_modules; zod keeps its global configuration on globalThis, and crw's schemas
 * never pass into the SDK's validation. Only `zod` itself is redirected: crw's sources import no subpath of
 * it. `zod` must also be in the build's noExternal, or tsup marks it external before this plugin sees it.
 */
const sharedZod: Plugin = {
  name: "shared-zod",
  setup(build) {
    build.onResolve({ filter: /^zod$/ }, () => ({ path: "@crw/db/zod", external: true }));
  },
};

/**
 * What every package's build shares: ESM for Node 20 with source maps; dependencies load from node_modules
 * at run time, except the inlined ones and zod (see above); `options` adds to it or overrides it.
 */
export function packageBuild(options: Options): Options {
  return {
    format: ["esm"],
    target: "node20",
    platform: "node",
    sourcemap: true,
    skipNodeModulesBundle: true,
    noExternal: [...inlinedDependencies, /^zod$/],
    esbuildPlugins: [sharedZod],
    ...options,
  };
}
