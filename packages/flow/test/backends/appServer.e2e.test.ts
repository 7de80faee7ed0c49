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
    const schema = { type: "object", required: ["tmp"], properties: { tmp: { type: "string" }, server: { type: "string" } }, additionalProperties: false };
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
      const server = /y=(\S*)/.exec(out)?.[1] ?? "";
      return {
        items: [{ type: "message", text: JSON.stringify({ tmp, server }), phase: "final_answer" }],
        usage,
      };
    }
    const text = lastUserText(req);
    // the first call's task turn answers prose: the engine's repair turn then runs (after the restart)
    if (text.startsWith("crw-flow-op: a.1/t1-")) {
      return { items: [{ type: "message", text: "Not sure yet.", phase: "final_answer" }], usage };
    }
    return {
      items: [
        {
          type: "function_call",
          name: "exec_command",
          arguments: { cmd: 'echo "x=$TMPDIR y=$CRW_SERVER_POLICY"' },
        },
      ],
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
    // the server's own shell environment policy: the run's entries go beside it, key by key
    extraToml: '\n[shell_environment_policy]\nset = { CRW_SERVER_POLICY = "kept" }\n',
  });
}, 120_000);

afterAll(async () => {
  await codex?.stop();
  await model?.stop();
  if (root && !process.env.CRW_KEEP_E2E) rmSync(root, { recursive: true, force: true });
});

/**
 * The scenario runs once: a start killed after its first turn_started, the task turn ending on the host
 * with nobody following it, the app-server restarted, a resume on another backend refused, the foreground
 * resume, then crw flow shadow.
 */
describe("--backend app-server with the real codex binary", () => {
  let runTmp: string;
  let startJson: Record<string, unknown>;
  let firstThread: Extract<JournalRow, { type: "thread_started" }>;
  let mixed: { code: number; unchanged: boolean };
  let resumeCode: number;
  let all: JournalRow[];
  let trail: string;
  let texts: string[];
  let shadow: { code: number; json: Record<string, unknown> };

  beforeAll(async () => {
    const repo = join(root, "repo");
    const state = join(root, "state");
    runTmp = join(root, "run-tmp");
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
    startJson = start.json();
    const pid = Number(startJson.pid);
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
    firstThread = thread;
    // the task turn ends on the host with nobody following it; then the app-server restarts
    const probe = createAppServerHost({ transport: codex.url });
    // the host answers asynchronously: read it until the task turn has ended
    for (let at = Date.now(); ; await new Promise((r) => setTimeout(r, 200))) {
      const t = await probe.readThread(thread.thread_id);
      if (t.ok && t.value.turns[0]?.status === "completed") break;
      if (Date.now() - at > 30_000) throw new Error("the task turn did not end on the host");
    }
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
    const specPath = join(state, "flow", "as", "run.json");
    const specText = readFileSync(specPath, "utf8");
    writeFileSync(specPath, JSON.stringify({ ...JSON.parse(specText), backend: "local" }));
    const before = readFileSync(journal, "utf8");
    const refused = await crwFlow(["resume", "as", "--state", state], env, repo);
    mixed = { code: refused.code, unchanged: readFileSync(journal, "utf8") === before };
    writeFileSync(specPath, specText);
    const resume = await crwFlow(["resume", "as", "--state", state], env, repo);
    resumeCode = resume.code;
    all = rows();
    trail = all
      .map(
        (r) =>
          `${r.type}${"call" in r ? ` ${r.call}` : ""}${"reason" in r ? ` ${r.reason}` : ""}${"detail" in r && typeof r.detail === "string" ? ` ${r.detail}` : ""}`,
      )
      .join("\n");
    texts = model.requests.map(lastUserText).filter((t) => t.startsWith("crw-flow-op: "));
    const sh = await crwFlow(["shadow", "as", "--state", state, "--json"], env, repo);
    shadow = { code: sh.code, json: sh.code === 0 ? sh.json() : {} };
  }, 240_000);

  const taskText = () => texts.find((t) => t.startsWith("crw-flow-op: a.1/t1-")) as string;
  const repairText = () => texts.find((t) => t.startsWith("crw-flow-op: a.1/t2-")) as string;

  it("the resumed run ends completed on the backend it started on; a resume on another backend is refused before any row", () => {
    expect(resumeCode).toBe(0);
    expect(
      all.find((r) => r.type === "run_ended"),
      trail,
    ).toMatchObject({
      status: "completed",
      result: { a: runTmp, b: runTmp },
    });
    expect(all.filter((r) => r.type === "started").map((r) => r.type === "started" && r.backend)).toEqual([
      "app-server",
      "app-server",
    ]);
    expect(mixed).toEqual({ code: 2, unchanged: true });
  });

  it("start --backend app-server opens a thread of the run's own per call, on the role's pair (S000-181)", () => {
    expect(startJson).toMatchObject({ backend: "app-server" });
    expect(firstThread).toMatchObject({
      via: "app-server",
      call: "a.1",
      model: "mock-a",
      effort: "high",
      parent_thread_id: null,
    });
    const threads = all.filter(
      (r): r is Extract<JournalRow, { type: "thread_started" }> => r.type === "thread_started",
    );
    expect(
      threads.map((r) => [r.call, r.via, r.parent_thread_id]),
      trail,
    ).toEqual([
      ["a.1", "app-server", null],
      ["b.1", "app-server", null],
    ]);
    expect(
      all
        .filter((r) => r.type === "prepared")
        .every((r) => r.type === "prepared" && r.backend === "app-server"),
    ).toBe(true);
  });

  it("a call's turn text ends with the tools section after the task, and the journaled input stays the script's (S000-052)", () => {
    expect(taskText()).toBeDefined();
    expect(taskText().indexOf("## Task")).toBeLessThan(taskText().indexOf("## Repository tools"));
    expect(taskText().trimEnd().endsWith(`- TMPDIR=${runTmp}`)).toBe(true);
    // the section a session packet carries: the directory's fact, the command prefix, the entries
    const tools = taskText().slice(taskText().indexOf("## Repository tools"));
    expect(tools).toContain(`- The run's temporary directory is ${runTmp} (env.TMPDIR of `);
    expect(tools).toContain(`\`\`\`\nTMPDIR=${runTmp}\n\`\`\``);
    expect(all.find((r) => r.type === "prepared" && r.call === "a.1")).toMatchObject({
      input: { task: "Report the run's temporary directory." },
    });
  });

  it("a thread the run starts runs its commands with the run's entries beside the server's own policy: b's shell saw the run's TMPDIR and the server's set entry", () => {
    expect(all.find((r) => r.type === "completed" && r.call === "b.1")).toMatchObject({
      result: { tmp: runTmp, server: "kept" },
    });
  });

  it("after the app-server restarted, the resumed thread runs with the entries again, and no row stores them (S000-054)", () => {
    // a.1's repair turn ran on the thread the restarted server resumed; its shell saw the run's TMPDIR
    const aTurns = all.filter((r) => r.type === "turn_started" && r.call === "a.1");
    expect(aTurns.map((r) => r.type === "turn_started" && r.conversation_turn)).toEqual([1, 2]);
    expect(all.find((r) => r.type === "completed" && r.call === "a.1")).toMatchObject({
      result: { tmp: runTmp },
    });
    expect(JSON.stringify(all)).not.toContain("shell_environment_policy");
  });

  it("the resumed turn's text still names the entries (S000-055)", () => {
    expect(repairText()).toBeDefined();
    expect(repairText().trimEnd().endsWith(`- TMPDIR=${runTmp}`)).toBe(true);
  });

  it("every completed call counts its tokens in all their parts", () => {
    const done = all.filter((r): r is Extract<JournalRow, { type: "completed" }> => r.type === "completed");
    expect(done).toHaveLength(2);
    for (const c of done) {
      expect(c.tokens.input ?? 0).toBeGreaterThan(0);
      expect(c.tokens.cached_input ?? 0).toBeGreaterThan(0);
      expect(c.tokens.output ?? 0).toBeGreaterThan(0);
      expect(c.tokens.reasoning_output ?? 0).toBeGreaterThan(0);
    }
  });

  it("crw flow shadow replays the run with no host and names its backend (S000-008)", () => {
    expect(shadow.code).toBe(0);
    expect(shadow.json).toMatchObject({ backend: "app-server", replay: "completed", divergences: [] });
  });
});
