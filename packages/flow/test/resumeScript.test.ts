import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type JournalRow, lockHolder, readJournalFile, readSpec, runPaths, writeSpec } from "@crw/flow";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { crwFlow, ensureBuilt, plainEnv, waitFor } from "./helpers/cli.js";

/**
 * `crw flow resume RUN SCRIPT`: a local run that waits for two decisions, started from one copy of its
 * workflow and resumed with another (the same workflow, answering which copy ran).
 */
const source = (copy: string) => `
export default {
  name: "two-decisions",
  async run(ctx) {
    const ship = await ctx.decide({ id: "ship", question: "Ship it?" });
    const tag = await ctx.decide({ id: "tag", question: "Tag it?" });
    return { ship, tag, copy: ${JSON.stringify(copy)} };
  },
};
`;

let root: string;
let env: NodeJS.ProcessEnv;
beforeAll(() => {
  ensureBuilt();
  root = mkdtempSync(join(tmpdir(), "crw-flow-resume-script-"));
  env = plainEnv();
}, 180_000);
afterAll(() => rmSync(root, { recursive: true, force: true }));

function file(name: string, text: string): string {
  const path = join(root, name);
  writeFileSync(path, text);
  return path;
}

async function pausedRun(run: string) {
  const state = join(root, `state-${run}`);
  const paths = runPaths(state, run);
  const start = await crwFlow(
    ["start", file(`${run}-a.mjs`, source("a")), "--run", run, "--state", state, "--json"],
    env,
    root,
  );
  expect(start.code, start.stderr).toBe(0);
  await untilPaused(paths, 1);
  return { state, paths, rows: () => readJournalFile(paths.journal).rows };
}

/** Until the run has paused `n` times and its process let it go. */
function untilPaused(paths: ReturnType<typeof runPaths>, n: number) {
  return waitFor(
    `pause ${n}`,
    () =>
      existsSync(paths.journal) &&
      readJournalFile(paths.journal).rows.filter((r) => r.type === "run_paused").length >= n &&
      lockHolder(paths.runLock) === null,
    30_000,
  );
}

const started = (rows: JournalRow[]) => rows.filter((r) => r.type === "started");

describe("crw flow resume RUN SCRIPT", () => {
  it("goes on with the started row's backend, runs SCRIPT, and the run's later processes run it too (S000-232)", async () => {
    const { state, paths, rows } = await pausedRun("rs-1");
    const b = file("rs-1-b.mjs", source("b"));
    expect(
      (await crwFlow(["answer", "rs-1", "ship", "yes", "--no-resume", "--state", state], env)).code,
    ).toBe(0);
    const resumed = await crwFlow(["resume", "rs-1", b, "--state", state], env, root);
    expect(resumed.code, resumed.stderr).toBe(0);
    await untilPaused(paths, 2);
    expect(started(rows())[1]).toMatchObject({ backend: "local", workflow: b, process_n: 2 });
    // the answer's own resume starts the run's next process: it runs the module the last one ran
    expect((await crwFlow(["answer", "rs-1", "tag", "no", "--state", state], env)).code).toBe(0);
    const ended = await waitFor("the run's end", () => rows().find((r) => r.type === "run_ended"), 30_000);
    expect(ended).toMatchObject({ status: "completed", result: { ship: "yes", tag: "no", copy: "b" } });
    expect(started(rows())[2]).toMatchObject({ backend: "local", workflow: b, process_n: 3 });
  }, 60_000);

  it("a spec naming another backend than the started row's is refused (exit 2) with SCRIPT too, nothing written (S000-232)", async () => {
    const { state, paths } = await pausedRun("rs-2");
    const spec = readSpec(paths.spec);
    writeSpec(paths.spec, { ...spec, backend: "app-server", host: "ws://127.0.0.1:9" });
    const before = readFileSync(paths.journal, "utf8");
    const b = file("rs-2-b.mjs", source("b"));
    const r = await crwFlow(["resume", "rs-2", b, "--state", state, "--json"], env, root);
    expect(r.code).toBe(2);
    expect(r.json()).toMatchObject({ error: { code: "mixed_backend" } });
    expect(readFileSync(paths.journal, "utf8")).toBe(before);
  }, 60_000);

  it("a SCRIPT that is missing, is no workflow or is another workflow is an input error (exit 2) before anything runs", async () => {
    const { state, paths } = await pausedRun("rs-3");
    const before = readFileSync(paths.journal, "utf8");
    const other = file("rs-3-other.mjs", 'export default { name: "other", run: async () => 1 };');
    const broken = file("rs-3-broken.mjs", "export default 42;");
    for (const script of [join(root, "missing.mjs"), broken, other]) {
      const r = await crwFlow(["resume", "rs-3", script, "--state", state, "--json"], env, root);
      expect(r.code).toBe(2);
      expect(r.json()).toMatchObject({ error: { code: "workflow_invalid" } });
    }
    const extra = await crwFlow(["resume", "rs-3", other, "more", "--state", state], env, root);
    expect(extra.code).toBe(2);
    expect(readFileSync(paths.journal, "utf8")).toBe(before);
  }, 60_000);
});
