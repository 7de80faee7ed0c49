import { defineConfig } from "tsup";

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
  {
    ...common,
    entry: ["src/index.ts"],
  },
  {
    ...common,
    // The forked runner process (RUNNER_ENTRY). It carries the workspace packages it runs (the delegation
    // core's turn runners) inside its one file, built from their sources: its build identity is the digest
    // of exactly what it runs, and it never depends on another package's build state.
    entry: ["src/runner.ts"],
    noExternal: [/^@crw\//],
    esbuildOptions(options) {
      options.conditions = ["@crw/source", "node", "import", "default"];
    },
    esbuildPlugins: [
      {
        // Every npm dependency of those packages stays an import resolved from node_modules at run time,
        // marked free of side effects so an import the runner never uses (the db package's migration
        // runner) is dropped instead of being loaded at every boot.
        name: "external-npm-without-side-effects",
        setup(build) {
          build.onResolve({ filter: /^[^./]/ }, (args) =>
            args.path.startsWith("@crw/") || args.path.startsWith("node:")
              ? undefined
              : { path: args.path, external: true, sideEffects: false },
          );
        },
      },
    ],
  },
]);
