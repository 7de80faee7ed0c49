// Preloaded into a forked runner (`--import`) by test/runnerBoot.test.ts: installs the hooks of
// npm-free-boot-hooks.mjs, which refuse every import that resolves into node_modules and every module that
// carries zod.
import { register } from "node:module";

register("./npm-free-boot-hooks.mjs", import.meta.url);
