// Preloaded into a forked runner (`--import`) by test/runnerBoot.test.ts: installs the resolve hook of
// npm-free-boot-hooks.mjs, which refuses every import that resolves into node_modules.
import { register } from "node:module";

register("./npm-free-boot-hooks.mjs", import.meta.url);
