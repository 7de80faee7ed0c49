import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import {
  buildIdentityOf,
  hasTypeScriptLoader,
  RunnerEntryMissingError,
  resolveRunnerEntry,
  runnerExecArgv,
} from "@crw/subagent";
import { describe, expect, it, onTestFinished } from "vitest";
import { startHost, turn } from "./support/runners.js";
import { tempDir } from "./support/tmp.js";

const pkg = join(import.meta.dirname, "..");

describe("RUNNER_ENTRY", () => {
  it("resolves the packaged runner.js beside the built module (S004-536)", () => {
    const fromDist = pathToFileURL(join(pkg, "dist/index.js")).href;
    expect(resolveRunnerEntry(fromDist, [])).toBe(join(pkg, "dist/runner.js"));
  });

  it("resolves the source runner.ts when the JavaScript sibling is absent and a loader runs TypeScript (S004-536)", async () => {
    const dir = tempDir("entry");
    await writeFile(join(dir, "runner.ts"), "export {};\n");
    const from = pathToFileURL(join(dir, "index.ts")).href;
    expect(resolveRunnerEntry(from, ["--import", "tsx"])).toBe(join(dir, "runner.ts"));
    // Without a loader plain Node cannot run it, and there is no build beside it.
    expect(() => resolveRunnerEntry(from, [])).toThrow(RunnerEntryMissingError);
    // Once the JavaScript sibling exists it wins, loader or not.
    await writeFile(join(dir, "runner.js"), "export {};\n");
    expect(resolveRunnerEntry(from, ["--import", "tsx"])).toBe(join(dir, "runner.js"));
  });

  it("source modules on plain Node use the package's own build, never PATH (S004-536)", () => {
    const fromSrc = pathToFileURL(join(pkg, "src/runnerEntry.ts")).href;
    expect(resolveRunnerEntry(fromSrc, [])).toBe(join(pkg, "dist/runner.js"));
  });

  it("a fork inherits the parent's TypeScript loader flags for runner.ts; built JS never gets the source condition (S004-537)", () => {
    const parent = ["--import", "tsx", "--conditions", "@crw/source", "--enable-source-maps"];
    expect(hasTypeScriptLoader(parent)).toBe(true);
    expect(runnerExecArgv("/x/runner.ts", parent)).toEqual(parent);
    expect(runnerExecArgv("/x/runner.js", parent)).toEqual(["--import", "tsx", "--enable-source-maps"]);
    expect(runnerExecArgv("/x/runner.js", ["--conditions=@crw/source", "--inspect=0"])).toEqual([
      "--inspect=0",
    ]);
    expect(hasTypeScriptLoader(["--enable-source-maps"])).toBe(false);
  });

  it("a runner forked from the source runner.ts under the parent's TypeScript loader boots and runs a turn (S004-537)", async () => {
    const entry = fileURLToPath(new URL("../src/runner.ts", import.meta.url));
    // The parent's own flags as a developer running the sources would have them (jiti's loader runs
    // TypeScript and finds ./x.ts for a NodeNext ./x.js); the fork must inherit them.
    const { host } = await startHost({
      entry,
      buildId: buildIdentityOf(entry),
      execArgv: ["--import", "jiti/register", "--conditions", "@crw/source"],
    });
    onTestFinished(() => host.shutdown(1_000));
    const result = await host.runTurn(turn({ script: [{ kind: "text", text: "from source" }] }));
    expect(result).toMatchObject({ text: "from source", stopReason: "end" });
  });
});
