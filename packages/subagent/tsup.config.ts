import { defineConfig } from "tsup";
import { inlinedDependencies, packageBuild, zodModules } from "../../tools/build/tsup.ts";

// What the runner bundles: crw's packages from their sources, the inlined libraries and zod (a dependency of
// this package, which tsup would keep external): it carries its own copy of everything it runs.
const runnerBundled = [/^@crw\//, zodModules, ...inlinedDependencies];

// Two builds write into dist at once: neither may clean it under the other.
export default defineConfig([
  packageBuild({ entry: ["src/index.ts"], clean: false, splitting: false }),
  packageBuild({
    clean: false,
    // its own plugin below decides what stays in node_modules
    skipNodeModulesBundle: false,
    // The forked runner process (RUNNER_ENTRY). It carries the workspace packages it runs (the delegation
    // core's turn runners) inside its one file, built from their sources: its build identity is the digest
    // of exactly what it runs, and it never depends on another package's build state.
    entry: ["src/runner.ts"],
    noExternal: runnerBundled,
    // What the runner imports only after boot (its request handling, the executors, the delegation core) is
    // split into chunks, so the fork reaches ready having loaded the handshake alone. Chunks are named by
    // content hash and the entry names the chunks it imports, so the entry's digest (the build identity)
    // still changes with any byte the runner can run.
    splitting: true,
    esbuildOptions(options) {
      options.conditions = ["@crw/source", "node", "import", "default"];
      options.chunkNames = "runner-chunks/[name]-[hash]";
    },
    esbuildPlugins: [
      {
        // Every other npm dependency of those packages stays an import resolved from node_modules at run
        // time, marked free of side effects so an import the runner never uses is dropped instead of being
        // loaded at every boot.
        name: "external-npm-without-side-effects",
        setup(build) {
          build.onResolve({ filter: /^[^./]/ }, (args) =>
            args.path.startsWith("node:") || runnerBundled.some((d) => d.test(args.path))
              ? undefined
              : { path: args.path, external: true, sideEffects: false },
          );
        },
      },
    ],
  }),
]);
