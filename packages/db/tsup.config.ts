import { defineConfig } from "tsup";
import { inlinedDependencies, packageBuild, zodModules } from "../../tools/build/tsup.ts";

// Two builds write into dist at once: neither may clean it under the other.
export default defineConfig([
  packageBuild({ entry: ["src/index.ts"], clean: false }),
  // The one copy of zod every crw build imports (`@crw/db/zod`), zod itself bundled into it.
  packageBuild({
    entry: { zod: "src/zod.ts" },
    clean: false,
    noExternal: [...inlinedDependencies, zodModules],
    esbuildPlugins: [],
  }),
]);
