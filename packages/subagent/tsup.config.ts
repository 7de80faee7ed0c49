import { defineConfig } from "tsup";
import { inlinedDependencies, packageBuild } from "../../tools/build/tsup.ts";

const common = {
  format: ["esm" as const],
  target: "node20",
  platform: "node" as const,
  sourcemap: true,
  // Two builds write into dist at once: neither may clean it under the other.
  clean: false,
  splitting: false,
};

export default defineConfig([
  packageBuild({ ...common, entry: ["src/index.ts"] }),
  {
    ...common,
    // The forked runner process (RUNNER_ENTRY). It carries the workspace packages it runs (the delegation
    // core's turn runners) inside its one file, built from their sources: its build identity is the digest
    // of exactly what it runs, and it never depends on another package's build state.
    entry: ["src/runner.ts"],
    // zod is a dependency of this package, which tsup would keep external: the runner carries its copy.
    noExternal: [/^@crw\//, /^zod(\/|$)/],
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
        // Every npm dependency of those packages but the inlined ones (see there) and zod stays an import
        // resolved from node_modules at run time, marked free of side effects so an import the runner never
        // uses is dropped instead of being loaded at every boot. zod is bundled: the runner carries its one
        // copy itself, as it carries everything else it runs.
        name: "external-npm-without-side-effects",
        setup(build) {
          build.onResolve({ filter: /^[^./]/ }, (args) =>
            args.path.startsWith("@crw/") ||
            args.path.startsWith("node:") ||
            /^zod(\/|$)/.test(args.path) ||
            inlinedDependencies.some((d) => d.test(args.path))
              ? undefined
              : { path: args.path, external: true, sideEffects: false },
          );
        },
      },
    ],
  },
]);
