import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  functionOutputs,
  MockModel,
  type ModelRequest,
  type RealCodex,
  restartRealCodex,
  startRealCodex,
  userTexts,
} from "@crw/tools/codex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createAppServerHost } from "../../src/index.js";
import { readJournalFile } from "../../src/journal/journal.js";
import type { JournalRow } from "../../src/journal/rows.js";
import { crwFlow, ensureBuilt, waitFor } from "../helpers/cli.js";

/**
 * `--backend app-server` end to end with the real codex app-server and the mock model: the run opens a
 * thread per call and runs its turns itself. The run process is killed right after its first turn_started,
 * the app-server is restarted while nothing follows the thread, and the foreground resume follows the
 * thread with thread/resume carrying the run's entries again.
 */

const workflowSource = `
export default {
  name: "as-e2e",
  async run(ctx) {
    const schema = { type: "object", required: ["tmp"], properties: { tmp: { type: "string" } }, additionalProperties: false };
    const a = await ctx.call({ role: "architect", node: "a", task: "Report the run's temporary directory.", schema });
    const b = await ctx.call({ role: "explorer", node: "b", task: "Report it again.", schema });
    return { a: a.tmp, b: b.tmp };
  },
};
`;

let root: string;
let model: MockModel;
let codex: RealCodex;
const usage = { input: 700, cached_input: 100, output: 40, reasoning_output: 5 };

function lastUserText(req: ModelRequest): string {
  return userTexts(req).at(-1) ?? "";
}

beforeAll(async () => {
  ensureBuilt();
  root = mkdtempSync(join(tmpdir(), "crw-flow-as-"));
  model = await MockModel.start();
  model.otherwise((req) => {
    const last = req.input.at(-1);
    if (last?.type === "function_call_output") {
      const out = functionOutputs(req).at(-1)?.output ?? "";
      const tmp = /x=(\S*)/.exec(out)?.[1] ?? "";
      return { items: [{ type: "message", text: JSON.stringify({ tmp }), phase: "final_answer" }], usage };
    }
    const text = lastUserText(req);
    // the first call's task turn answers prose: the engine's repair turn then runs (after the restart)
    if (text.startsWith("crw-flow-op: a.1/t1-")) {
      return { items: [{ type: "message", text: "Not sure yet.", phase: "final_answer" }], usage };
    }
    return {
      items: [{ type: "function_call", name: "exec_command", arguments: { cmd: 'echo "x=$TMPDIR"' } }],
      usage,
    };
  });
  const repo = join(root, "repo");
  mkdirSync(join(repo, ".crw"), { recursive: true });
  writeFileSync(
    join(repo, ".crw", "flow-roles.json"),
    JSON.stringify({
      roles: { architect: { model: "mock-a", effort: "high" }, explorer: { model: "mock-b" } },
    }),
  );
  codex = await startRealCodex({
    home: join(root, "codex-home"),
    cwd: repo,
    baseUrl: model.baseUrl,
    models: ["mock-a", "mock-b"],
    listen: "ws",
  });
}, 120_000);

afterAll(async () => {
  await codex?.stop();
  await model?.stop();
  if (root && !process.env.CRW_KEEP_E2E) rmSync(root, { recursive: true, force: true });
});

describe("--backend app-server with the real codex binary", () => {
  it("S000-008 S000-181 S000-052 S000-053 S000-054 S000-055: a thread per call with the entries as leaf keys; killed after a turn_started, the app-server restarted, the resume follows the thread with the entries again", async () => {
    const repo = join(root, "repo");
    const state = join(root, "state");
    const runTmp = join(root, "run-tmp");
    mkdirSync(runTmp);
    const workflow = join(repo, "as.mjs");
    writeFileSync(workflow, workflowSource);
    const env: NodeJS.ProcessEnv = { ...process.env, TMPDIR: runTmp };
    delete env.CRW_FLOW_FAULT;
    delete env.CODEX_THREAD_ID;
    const start = await crwFlow(
      [
        "start",
        workflow,
        "--backend",
        "app-server",
        "--host",
        codex.url,
        "--state",
        state,
        "--run",
        "as",
        "--repo",
        repo,
        "--json",
      ],
      { ...env, CRW_FLOW_FAULT: "after:turn_started:1" },
      repo,
    );
    expect(start.code, start.stderr).toBe(0);
    expect(start.json()).toMatchObject({ backend: "app-server" });
    const pid = Number(start.json().pid);
    const journal = join(state, "flow", "as", "journal.jsonl");
    const rows = (): JournalRow[] => readJournalFile(journal).rows;
    await waitFor(
      "the run process to die after its first turn_started",
      () => {
        try {
          process.kill(pid, 0);
          return false;
        } catch {
          return true;
        }
      },
      60_000,
    );
    const thread = rows().find((r) => r.type === "thread_started");
    if (thread?.type !== "thread_started") throw new Error("no thread_started");
    expect(thread).toMatchObject({
      via: "app-server",
      call: "a.1",
      model: "mock-a",
      effort: "high",
      parent_thread_id: null,
    });
    // the task turn ends on the host with nobody following it; then the app-server restarts
    const probe = createAppServerHost({ transport: codex.url });
    await expect
      .poll(
        async () => {
          const t = await probe.readThread(thread.thread_id);
          return t.ok ? t.value.turns[0]?.status : "unread";
        },
        { timeout: 30_000, interval: 200 },
      )
      .toBe("completed");
    await probe.close();
    // the server stops only once the turn's end is on disk (the restarted server reads the rollout)
    const rollout = thread.rollout_path;
    if (!rollout) throw new Error("thread_started has no rollout_path");
    await waitFor(
      "the task turn's end in the rollout",
      () => existsSync(rollout) && readFileSync(rollout, "utf8").includes('"task_complete"'),
      30_000,
    );
    codex = await restartRealCodex(codex);
    // a resume on another backend is refused before any row is written
    const specPath = join(state, "flow", "as", "run.json");
    const specText = readFileSync(specPath, "utf8");
    writeFileSync(specPath, JSON.stringify({ ...JSON.parse(specText), backend: "local" }));
    const before = readFileSync(journal, "utf8");
    const mixed = await crwFlow(["resume", "as", "--state", state], env, repo);
    expect(mixed.code).toBe(2);
    expect(readFileSync(journal, "utf8")).toBe(before);
    writeFileSync(specPath, specText);
    const resume = await crwFlow(["resume", "as", "--state", state], env, repo);
    expect(resume.code, resume.stderr).toBe(0);
    const all = rows();
    const trail = all.map(
      (r) =>
        `${r.type}${"call" in r ? ` ${r.call}` : ""}${"reason" in r ? ` ${r.reason}` : ""}${"detail" in r && typeof r.detail === "string" ? ` ${r.detail}` : ""}`,
    );
    expect(
      all.find((r) => r.type === "run_ended"),
      trail.join("\n"),
    ).toMatchObject({
      status: "completed",
      result: { a: runTmp, b: runTmp },
    });
    expect(all.filter((r) => r.type === "started").map((r) => r.type === "started" && r.backend)).toEqual([
      "app-server",
      "app-server",
    ]);
    expect(
      all
        .filter((r) => r.type === "prepared")
        .every((r) => r.type === "prepared" && r.backend === "app-server"),
    ).toBe(true);
    // a thread per call, each the run's own (no parent)
    const threads = all.filter((r) => r.type === "thread_started");
    expect(
      threads.map((r) => r.type === "thread_started" && r.call),
      trail.join("\n"),
    ).toEqual(["a.1", "b.1"]);
    // a.1: the task turn, then its repair on the resumed thread (after the restart): x is the run's TMPDIR
    const aTurns = all.filter((r) => r.type === "turn_started" && r.call === "a.1");
    expect(aTurns.map((r) => r.type === "turn_started" && r.conversation_turn)).toEqual([1, 2]);
    // the turn texts end with the tools section naming the entries; the journaled input stays the script's
    const texts = model.requests.map(lastUserText).filter((t) => t.startsWith("crw-flow-op: "));
    const task = texts.find((t) => t.startsWith("crw-flow-op: a.1/t1-"));
    const repair = texts.find((t) => t.startsWith("crw-flow-op: a.1/t2-"));
    expect(task).toBeDefined();
    expect(repair).toBeDefined();
    for (const t of [task, repair] as string[]) {
      expect(t.trimEnd().endsWith(`- TMPDIR=${runTmp}`)).toBe(true);
    }
    expect((task as string).indexOf("## Task")).toBeLessThan((task as string).indexOf("## Repository tools"));
    const prepared = all.find((r) => r.type === "prepared" && r.call === "a.1");
    expect(prepared).toMatchObject({ input: { task: "Report the run's temporary directory." } });
    // tokens in all their parts (thread/tokenUsage/updated, the thread's total)
    const done = all.filter((r) => r.type === "completed");
    expect(done).toHaveLength(2);
    for (const c of done) {
      if (c.type !== "completed") continue;
      expect(c.tokens.input ?? 0).toBeGreaterThan(0);
      expect(c.tokens.cached_input ?? 0).toBeGreaterThan(0);
      expect(c.tokens.output ?? 0).toBeGreaterThan(0);
      expect(c.tokens.reasoning_output ?? 0).toBeGreaterThan(0);
    }
    // the shadow replays it with no host and names the backend
    const shadow = await crwFlow(["shadow", "as", "--state", state, "--json"], env, repo);
    expect(shadow.code, shadow.stderr).toBe(0);
    expect(shadow.json()).toMatchObject({ backend: "app-server", replay: "completed", divergences: [] });
  }, 240_000);
});
