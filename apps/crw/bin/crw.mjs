#!/usr/bin/env node
// The built CLI lives in dist/; this stub exists so that `npm ci` can link the bin before any build.
import { existsSync } from "node:fs";

const main = new URL("../dist/index.js", import.meta.url);
if (!existsSync(main)) {
  process.stderr.write("crw: the CLI is not built yet; run `npm run build` in the repository first\n");
  process.exit(2);
}
// A reader that stops early (`crw daemon status | head -3`) is not a failure of the command.
process.stdout.on("error", (e) => {
  if (e.code === "EPIPE") process.exit(process.exitCode ?? 0);
  throw e;
});
const { runCli } = await import(main.href);
process.exitCode = await runCli(process.argv.slice(2));
