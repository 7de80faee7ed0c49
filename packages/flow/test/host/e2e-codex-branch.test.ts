import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  functionCalls,
  functionOutputs,
  MockModel,
  type ModelReply,
  type ModelRequest,
  type OwnerModelState,
  ownerModel,
  type RealCodex,
  startRealCodex,
  subagentTurn,
  toolNames,
  userTexts,
} from "@crw/tools/codex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readJournalFile } from "../../src/journal/journal.js";
import type { JournalRow, RowOf } from "../../src/journal/rows.js";
import { runPaths } from "../../src/run/paths.js";
import { tempRepo } from "../git/repo.js";
import { crwBin, crwFlow, ensureBuilt } from "../helpers/cli.js";

/**
 * The run's branch on the session backend with the real `codex app-server` as host, offline. The mock
 * Responses model plays the owner (it steps the run through Codex's shell and spawn_agent, as in
 * e2e-codex.test.ts) and the subagents, which work through Codex's own shell tool (exec_command; the
 * pinned codex offers subagents exec_command, write_stdin, apply_patch (a freeform tool), view_image …).
 * The executor's subagent writes NOTES.md in the workspace its spawn message names; crw commits it onto
 * `crw/flow/<run>`; the reviewer's subagent, spawned after it, reads the file in its own workspace (a
 * worktree at the executor's commit); `crw flow land` fast-forwards main. A second run, in a repository of
 * its own and at the same time on the same app-server, writes the file too while the user commits another
 * content of it on main: its land refuses and changes nothing.
 *
 * The config's sandbox_mode is the harness's danger-full-access: Codex's Linux sandbox cannot run on this
 * kind of machine (its helper is not found: "Failed to execvp linux").
 */

const schemaOk = { type: "object", required: ["ok"], properties: { ok: { type: "boolean" } } };
const schemaSeen = {
  type: "object",
  required: ["seen", "head"],
  properties: { seen: { type: "string" }, head: { type: "string" } },
};

const workflowSource = `
export default {
  name: "branch-e2e",
  async run(ctx, input) {
    const write = await ctx.callWithWork({ role: "executor", node: "write", task: "Write NOTES.md: " + input.notes, schema: ${JSON.stringify(schemaOk)} });
    const review = await ctx.callWithWork({ role: "reviewer", node: "review", task: "Review NOTES.md", schema: ${JSON.stringify(schemaSeen)} });
    return { write, review };
  },
};
`;

const roles = { roles: { executor: { model: "mock-executor" }, reviewer: { model: "mock-reviewer" } } };
const executorSubject = "crw flow: write.1 (executor)";

type Row = JournalRow & Record<string, unknown>;

interface Scenario {
  name: string;
  notes: string;
  root: string;
  repo: string;
  /** main's commit when the run started. */
  base: string;
  state: string;
  sh: (cwd: string, ...args: string[]) => string;
  owner: string;
  played: OwnerModelState;
  log: string[];
  /** Whether main's checkout had NOTES.md when the owner's turn ended (before any land). */
  notesInCheckout: boolean;
}

interface ShellCall {
  workspace: string;
  role: string;
  marker: string;
  cmd: string;
  workdir: string;
  output: string;
}

let root: string;
let model: MockModel;
let codex: RealCodex;
let landRun: Scenario;
let clashRun: Scenario;
/** The tools the real Codex offered an executor's subagent. */
let subagentTools: string[] = [];
/** The exec_command calls the subagents made, with the output the real Codex sent back to the model. */
const shellCalls: ShellCall[] = [];
/** The spawn messages the subagents received (their first user message), by workspace. */
const spawnTexts = new Map<string, string>();
/** The temporary directories to remove at the end. */
const dirs: string[] = [];

const usage = { input: 400, output: 20 };
const exec = (cmd: string, workdir: string, callId: string): ModelReply => ({
  items: [
    {
      type: "function_call",
      name: "exec_command",
      callId,
      arguments: { cmd, workdir, login: false, yield_time_ms: 20_000, max_output_tokens: 10_000 },
    },
  ],
  usage,
});
const answer = (value: unknown): ModelReply => ({
  items: [{ type: "message", text: JSON.stringify(value), phase: "final_answer" }],
  usage,
});
const outputBody = (out: string) =>
  out.includes("\nOutput:\n") ? out.slice(out.indexOf("\nOutput:\n") + 9) : out;

/** The spawn message names the workspace and the packet (the seed's form). */
function spawnFacts(request: ModelRequest): { text: string; workspace: string; packet: string } {
  const text = userTexts(request).find((t) => t.includes("CRW-ROLE:")) ?? "";
  return {
    text,
    workspace: /Your workspace is (\S+): run/.exec(text)?.[1] ?? "",
    packet: /Read the task packet (\S+) in full/.exec(text)?.[1] ?? "",
  };
}

/**
 * A subagent: its first request runs one shell command with Codex's exec_command, with the workspace its
 * spawn message names as workdir (the executor writes NOTES.md with the text of its packet's task; the
 * reviewer reads the file and the commit its checkout is at); the next request answers the JSON from the
 * command's output.
 */
function subagentReply(request: ModelRequest): ModelReply {
  const { role, marker } = subagentTurn(request);
  const { text, workspace, packet } = spawnFacts(request);
  const outputs = functionOutputs(request);
  if (outputs.length === 0) {
    spawnTexts.set(workspace, text);
    if (role === "executor") {
      subagentTools = toolNames(request);
      // the task is in the packet crw wrote; the subagent reads it (here the mock model, from the file)
      const notes = /^Write NOTES\.md: (.*)$/m.exec(readFileSync(packet, "utf8"))?.[1] ?? "";
      return exec(`printf '%s\\n' ${JSON.stringify(notes)} > NOTES.md`, workspace, "write_notes");
    }
    if (role === "reviewer")
      return exec("cat NOTES.md && echo '--- head' && git log -1 --format=%s", workspace, "read_notes");
    return answer({});
  }
  const out = outputs.at(-1)?.output ?? "";
  const args = JSON.parse(functionCalls(request).at(-1)?.arguments ?? "{}") as {
    cmd?: string;
    workdir?: string;
  };
  shellCalls.push({
    workspace,
    role: role ?? "",
    marker: marker ?? "",
    cmd: args.cmd ?? "",
    workdir: args.workdir ?? "",
    output: out,
  });
  if (role === "executor") return answer({ ok: /Process exited with code 0/.test(out) });
  const [seen = "", head = ""] = outputBody(out).split("--- head\n");
  return answer({ seen: seen.trim(), head: head.trim() });
}

async function runScenario(name: string, notes: string): Promise<Scenario> {
  const { root: dir, repo, sh } = tempRepo(`crw-e2e-branch-${name}-`);
  dirs.push(dir);
  // the role store is committed: every worktree of the run has it, and main's checkout stays clean
  mkdirSync(join(repo, ".crw"), { recursive: true });
  writeFileSync(join(repo, ".crw", "flow-roles.json"), JSON.stringify(roles));
  sh(repo, "add", "-A");
  sh(repo, "commit", "-q", "-m", "roles");
  const base = sh(repo, "rev-parse", "HEAD");
  const state = join(dir, "state");
  const workflow = join(dir, "branch.mjs");
  writeFileSync(workflow, workflowSource);
  const start = [
    process.execPath,
    crwBin,
    "flow start",
    workflow,
    `--repo ${repo}`,
    `--state ${state}`,
    `--run ${name}`,
    `--input '${JSON.stringify({ notes })}'`, // (notes without a quote: the owner's shell reads this line)
    `--host ${codex.url}`,
    "--poll-ms 100",
    "--json",
  ].join(" ");
  const log: string[] = [];
  const played = ownerModel({ startCommand: start, log: (l) => log.push(l) });
  // the owner works in main's checkout, as a user's Codex would; its subagents start there too
  const started = await codex.client.request<{ thread: { id: string } }>("thread/start", { cwd: repo });
  const owner = started.thread.id;
  model.on((r) => r.threadId === owner && r.parentThreadId === null, played.handler);
  const turn = await codex.client.request<{ turn: { id: string } }>("turn/start", {
    threadId: owner,
    input: [{ type: "text", text: "Run the branch workflow with crw flow.", text_elements: [] }],
  });
  try {
    await codex.client.waitTurnCompleted(owner, turn.turn.id, 150_000);
  } finally {
    writeFileSync(join(dir, "owner.log"), log.join("\n"));
  }
  const notesInCheckout = existsSync(join(repo, "NOTES.md"));
  return { name, notes, root: dir, repo, base, state, sh, owner, played: played.state, log, notesInCheckout };
}

const rowsOf = (s: Scenario): Row[] => readJournalFile(runPaths(s.state, s.name).journal).rows as Row[];
const prepared = (rows: Row[], call: string) =>
  rows.find((r): r is RowOf<"prepared"> & Row => r.type === "prepared" && r.call === call);
const completed = (rows: Row[], call: string) =>
  rows.find((r): r is RowOf<"completed"> & Row => r.type === "completed" && r.call === call);
const threadOf = (rows: Row[], call: string) =>
  rows.find((r): r is RowOf<"thread_started"> & Row => r.type === "thread_started" && r.call === call);

beforeAll(async () => {
  ensureBuilt();
  root = mkdtempSync(join(tmpdir(), "crw-e2e-branch-"));
  dirs.push(root);
  model = await MockModel.start();
  model.on((r) => r.parentThreadId !== null, subagentReply);
  codex = await startRealCodex({
    home: join(root, "codex-home"),
    cwd: root,
    baseUrl: model.baseUrl,
    models: ["mock-executor", "mock-reviewer"],
    listen: "ws",
    // the agent types crw's roles spawn as are Codex roles of their own
    extraToml: ["executor", "reviewer"]
      .map((role) => `\n[agents.${role}]\ndescription = "crw flow ${role}"\n`)
      .join(""),
  });
  [landRun, clashRun] = await Promise.all([
    runScenario("land", "# notes from the codex subagent"),
    runScenario("clash", "# notes of the second run"),
  ]);
}, 240_000);

afterAll(async () => {
  await codex?.stop();
  await model?.stop();
  if (!process.env.CRW_KEEP_E2E) for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

describe("the run's branch with the real codex as host (session backend)", () => {
  it("both owners stepped their runs to the end through the real codex", () => {
    for (const s of [landRun, clashRun]) {
      expect(s.played.failure, s.log.join("\n")).toBeNull();
      expect(s.played.finalState, s.log.join("\n")).toMatchObject({
        state: "ended",
        ended: { status: "completed" },
      });
      expect(rowsOf(s).find((r) => r.type === "run_branch")).toMatchObject({
        branch: `crw/flow/${s.name}`,
        base: s.base,
        from: "main",
      });
    }
    // the subagents' tools as the pinned codex offers them: the shell (exec_command) they used
    expect(subagentTools).toContain("exec_command");
  });

  it("the executor's subagent wrote NOTES.md with Codex's shell in its worktree, never in main's checkout; crw committed it onto the run's branch", () => {
    const run = landRun;
    const rows = rowsOf(run);
    const p = prepared(rows, "write.1");
    expect(p?.allocation).toMatchObject({ kind: "worktree", start: run.base });
    const workspace = String(p?.allocation.workspace);
    expect(workspace).toContain(join(run.state, "flow", "land"));
    // the spawn message the real subagent got named that worktree, and its shell ran there
    expect(spawnTexts.get(workspace)).toContain(`Your workspace is ${workspace}:`);
    const write = shellCalls.find((c) => c.workspace === workspace);
    expect(write).toMatchObject({ role: "executor", marker: "write.1/t1-a1", workdir: workspace });
    expect(write?.output).toMatch(/Process exited with code 0/);
    expect(threadOf(rows, "write.1")).toMatchObject({ via: "session", cwd: workspace, host_cwd: run.repo });
    // the commit: crw's, on the start, with the file the subagent wrote
    const work = completed(rows, "write.1")?.work;
    const commit = String(work?.commit);
    expect(work).toEqual({ start: run.base, commit, paths: ["NOTES.md"] });
    const intent = rows.find((r) => r.type === "commit_intended" && r.call === "write.1");
    expect(intent).toMatchObject({ commit, parent: run.base, paths: ["NOTES.md"] });
    expect(intent?.seq).toBeLessThan(completed(rows, "write.1")?.seq ?? -1);
    expect(run.sh(run.repo, "rev-parse", "crw/flow/land")).toBe(commit);
    expect(run.sh(run.repo, "rev-parse", `${commit}^`)).toBe(run.base);
    expect(run.sh(run.repo, "log", "-1", "--format=%s", commit)).toBe(executorSubject);
    expect(run.sh(run.repo, "show", `${commit}:NOTES.md`)).toBe(run.notes);
    expect(readFileSync(join(workspace, "NOTES.md"), "utf8")).toBe(`${run.notes}\n`);
    // the subagent's shell started in the owner's cwd (main's checkout): nothing landed there by itself
    expect(run.notesInCheckout).toBe(false);
    expect(run.sh(run.repo, "rev-parse", "main")).toBe(run.base);
  });

  it("the reviewer's packet names its worktree, which is at the executor's commit and has the file; its real shell read it there", () => {
    const run = landRun;
    const rows = rowsOf(run);
    const commit = String(completed(rows, "write.1")?.work?.commit);
    const p = prepared(rows, "review.1");
    expect(p?.allocation).toMatchObject({ kind: "worktree", start: commit });
    const workspace = String(p?.allocation.workspace);
    expect(workspace).not.toBe(String(prepared(rows, "write.1")?.allocation.workspace));
    // the step's packet under the run dir names the worktree; the spawn message names the packet
    const packet = join(runPaths(run.state, run.name).steps, "review.1", "packet-t1-a1.md");
    expect(rows.find((r) => r.type === "step_published" && r.call === "review.1")).toMatchObject({
      packet,
      workspace,
    });
    const packetText = readFileSync(packet, "utf8");
    expect(packetText).toContain(`Your workspace is ${workspace}.`);
    expect(packetText).toContain("Review NOTES.md");
    expect(spawnTexts.get(workspace)).toContain(`Read the task packet ${packet} in full`);
    // on disk: the reviewer's worktree is at the executor's commit and has its file
    expect(run.sh(workspace, "rev-parse", "HEAD")).toBe(commit);
    expect(readFileSync(join(workspace, "NOTES.md"), "utf8")).toBe(`${run.notes}\n`);
    expect(run.sh(workspace, "status", "--porcelain")).toBe("");
    // the real Codex ran the reviewer's cat there and gave the model the executor's file and commit
    const read = shellCalls.find((c) => c.workspace === workspace);
    expect(read).toMatchObject({ role: "reviewer", marker: "review.1/t1-a1", workdir: workspace });
    expect(outputBody(String(read?.output))).toBe(`${run.notes}\n--- head\n${executorSubject}\n`);
    expect(threadOf(rows, "review.1")).toMatchObject({ via: "session", cwd: workspace });
    // a reviewer commits nothing and is told what it started from
    expect(completed(rows, "review.1")?.work).toEqual({ start: commit, commit: null, paths: [] });
    expect(rows.find((r) => r.type === "run_ended")).toMatchObject({
      status: "completed",
      result: {
        write: {
          op: "write.1",
          answer: { ok: true },
          work: { start: run.base, commit, paths: ["NOTES.md"] },
        },
        review: {
          op: "review.1",
          answer: { seen: run.notes, head: executorSubject },
          work: { start: commit, commit: null, paths: [] },
        },
      },
    });
  });

  it("crw flow show tells the branch, and crw flow land fast-forwards main: the user's checkout has the file", async () => {
    const run = landRun;
    const commit = String(completed(rowsOf(run), "write.1")?.work?.commit);
    const show = await crwFlow(["show", run.name, "--state", run.state, "--json"]);
    expect(show.code, show.stderr).toBe(0);
    expect(show.json().branch).toMatchObject({
      name: "crw/flow/land",
      base: run.base,
      from: "main",
      tip: commit,
      commits: [{ call: "write.1", role: "executor", commit, paths: ["NOTES.md"] }],
      landed: false,
    });
    const land = await crwFlow(["land", run.name, "--state", run.state, "--json"]);
    expect(land.code, land.stderr).toBe(0);
    expect(land.json()).toMatchObject({
      branch: "crw/flow/land",
      into: "main",
      before: run.base,
      after: commit,
      fast_forward: true,
      changed_paths: ["NOTES.md"],
    });
    expect(run.sh(run.repo, "rev-parse", "main")).toBe(commit);
    expect(run.sh(run.repo, "rev-parse", "HEAD")).toBe(commit);
    expect(readFileSync(join(run.repo, "NOTES.md"), "utf8")).toBe(`${run.notes}\n`);
    expect(run.sh(run.repo, "status", "--porcelain")).toBe("");
    expect((await crwFlow(["show", run.name, "--state", run.state, "--json"])).json().branch).toMatchObject({
      landed: true,
    });
  });

  it("a run whose NOTES.md the user meanwhile committed otherwise on main: the land refuses naming the path, and main is unchanged", async () => {
    const run = clashRun;
    const rows = rowsOf(run);
    const work = completed(rows, "write.1")?.work;
    const commit = String(work?.commit);
    expect(work).toEqual({ start: run.base, commit, paths: ["NOTES.md"] });
    expect(run.sh(run.repo, "show", `${commit}:NOTES.md`)).toBe(run.notes);
    expect(completed(rows, "review.1")?.result).toEqual({ seen: run.notes, head: executorSubject });
    // the user commits another content of the file on main before the run lands
    writeFileSync(join(run.repo, "NOTES.md"), "# the user's own notes\n");
    run.sh(run.repo, "add", "NOTES.md");
    run.sh(run.repo, "commit", "-q", "-m", "user notes");
    const userTip = run.sh(run.repo, "rev-parse", "main");
    const land = await crwFlow(["land", run.name, "--state", run.state, "--json"]);
    expect(land.code, land.stdout).toBe(1);
    expect(land.json()).toMatchObject({ error: { code: "merge_conflict" } });
    expect(land.stderr).toMatch(/conflicts with main in NOTES\.md: nothing was landed/);
    // nothing changed: main, its checkout, the run's branch
    expect(run.sh(run.repo, "rev-parse", "main")).toBe(userTip);
    expect(run.sh(run.repo, "rev-parse", "HEAD")).toBe(userTip);
    expect(readFileSync(join(run.repo, "NOTES.md"), "utf8")).toBe("# the user's own notes\n");
    expect(run.sh(run.repo, "status", "--porcelain")).toBe("");
    expect(run.sh(run.repo, "rev-parse", "crw/flow/clash")).toBe(commit);
    expect((await crwFlow(["show", run.name, "--state", run.state, "--json"])).json().branch).toMatchObject({
      tip: commit,
      landed: false,
    });
  });
});
