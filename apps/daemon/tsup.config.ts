import { defineConfig } from "tsup";
import { packageBuild } from "../../tools/build/tsup.ts";

export default defineConfig(packageBuild({ entry: ["src/index.ts"], clean: true }));
