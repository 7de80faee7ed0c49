import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pidAlive, readJournalFile, readSpec, runPaths, writeSpec } from "@crw/flow";
import type { FakeAppServer } from "@crw/tools/codex";
import { fileStepSource, ScriptedOwner } from "@crw/tools/flow";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { crwFlow, ownerSession, waitFor } from "./helpers/cli.js";

/** The workflow reports the TMPDIR its run process runs below. */
const workflowSource = `
export default {
  name: "env",
  async run(ctx) {
    await ctx.call({ role: "explorer", task: "t", schema: { type: "object" } });
    return { tmp: process.env.TMPDIR ?? null };
  },
};
`;

let fake: FakeAppServer;
let root: string;
let owner: string;
let env: NodeJS.ProcessEnv;
let workflowPath: string;

beforeAll(async () => {
  ({ fake, root, owner, env } = await ownerSession("crw-flow-env-"));
  workflowPath = join(root, "env.mjs");
  writeFileSync(workflowPath, workflowSource);
}, 120_000);

afterAll(async () => {
  await fake?.stop();
  rmSync(root, { recursive: true, force: true });
});

/** Starts a run below `startTmp`, kills its process once it has its started row, and returns its paths. */
async function startAndKill(runId: string, startTmp: string) {
  const state = join(root, "state");
  const paths = runPaths(state, runId);
  const r = await crwFlow(
    ["start", workflowPath, "--run", runId, "--state", state, "--poll-ms", "20", "--json"],
    { ...env, TMPDIR: startTmp },
    root,
  );
  expect(r.code, r.stderr).toBe(0);
  const pid = Number(r.json().pid);
  await waitFor(
    "started row",
    () => existsSync(paths.journal) && readJournalFile(paths.journal).rows.some((x) => x.type === "started"),
  );
  process.kill(pid, "SIGKILL");
  await waitFor("the process to die", () => !pidAlive(pid));
  return { state, paths };
}

async function finish(runId: string, state: string): Promise<unknown> {
  const paths = runPaths(state, runId);
  const kit = new ScriptedOwner({
    fake,
    owner,
    source: fileStepSource({ state, runId, replyWaitMs: 2000 }),
    behave: () => ({ kind: "answer", messages: [{ text: "{}", phase: "final_answer" }] }),
  }).start();
  try {
    await waitFor(
      "the run to end",
      () => readJournalFile(paths.journal).rows.some((x) => x.type === "run_ended"),
      30_000,
    );
  } finally {
    await kit.stop();
  }
  const last = readJournalFile(paths.journal).rows.at(-1);
  return last?.type === "run_ended" ? last.result : undefined;
}

describe("the run's recorded environment", () => {
  it("S000-238 S000-239 S000-248 S000-250: a run relaunched from a shell with another TMPDIR, or none, runs below the TMPDIR its start recorded", async () => {
    const recorded = mkdtempSync(join(root, "recorded-"));
    const other = mkdtempSync(join(root, "other-"));
    const { state } = await startAndKill("env-1", recorded);
    const r = await crwFlow(["resume", "env-1", "--detach", "--state", state, "--json"], {
      ...env,
      TMPDIR: other,
    });
    expect(r.code, r.stderr).toBe(0);
    expect(await finish("env-1", state)).toEqual({ tmp: recorded });
  });

  it("S000-240: a spec written before the env record leaves the launched process the caller's environment", async () => {
    const recorded = mkdtempSync(join(root, "recorded-"));
    const other = mkdtempSync(join(root, "other-"));
    const { state, paths } = await startAndKill("env-2", recorded);
    const { env: _dropped, ...legacy } = readSpec(paths.spec);
    writeSpec(paths.spec, legacy);
    const r = await crwFlow(["resume", "env-2", "--detach", "--state", state, "--json"], {
      ...env,
      TMPDIR: other,
    });
    expect(r.code, r.stderr).toBe(0);
    expect(await finish("env-2", state)).toEqual({ tmp: other });
  });

  it("S000-251: an in-process run (foreground resume) with an unusable recorded TMPDIR is refused with exit 2 before any lock or row", async () => {
    const recorded = mkdtempSync(join(root, "recorded-"));
    const { state, paths } = await startAndKill("env-3", recorded);
    rmSync(recorded, { recursive: true });
    const before = readFileSync(paths.journal, "utf8");
    const r = await crwFlow(["resume", "env-3", "--state", state], env);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(recorded);
    expect(readFileSync(paths.journal, "utf8")).toBe(before);
    expect(
      existsSync(paths.runLock) && readFileSync(paths.runLock, "utf8").includes(String(process.pid)),
    ).toBe(false);
  });
});
