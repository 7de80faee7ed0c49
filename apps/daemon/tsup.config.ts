import { defineConfig } from "tsup";
import { packageBuild } from "../../tools/build/tsup.ts";

export default defineConfig(
  packageBuild({
    // control: what `crw daemon start|stop|status` read without loading the daemon itself
    entry: { index: "src/index.ts", control: "src/control.ts" },
    splitting: true,
    clean: true,
  }),
);
