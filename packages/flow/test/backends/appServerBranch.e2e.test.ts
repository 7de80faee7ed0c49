import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  functionCalls,
  functionOutputs,
  MockModel,
  type ModelReply,
  type ModelRequest,
  type RealCodex,
  startRealCodex,
  userTexts,
} from "@crw/tools/codex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readJournalFile } from "../../src/journal/journal.js";
import type { JournalRow, RowOf } from "../../src/journal/rows.js";
import { tempRepo } from "../git/repo.js";
// the build serialized by a lock with every other test file that builds so (two tsup builds must not overlap)
import { crwFlow, ensureBuilt, waitFor } from "../helpers/cli.js";

/**
 * The run's branch on `--backend app-server` with the real codex app-server and the mock model: crw opens
 * a thread per call with the call's worktree as its cwd. The executor's thread writes NOTES.md with Codex's
 * shell tool (exec_command, no workdir: the thread's own cwd); crw commits it onto `crw/flow/<run>`; the
 * reviewer's thread, in a worktree at that commit, reads the file with the shell too; `crw flow land`
 * fast-forwards main. (The config's sandbox_mode is the harness's danger-full-access: Codex's Linux sandbox
 * cannot run on this kind of machine.)
 */

const schemaOk = { type: "object", required: ["ok"], properties: { ok: { type: "boolean" } } };
const schemaSeen = {
  type: "object",
  required: ["cwd", "seen", "head"],
  properties: { cwd: { type: "string" }, seen: { type: "string" }, head: { type: "string" } },
};
const notes = "# notes from the app-server thread";
const executorSubject = "crw flow: write.1 (executor)";

const workflowSource = `
export default {
  name: "as-branch",
  async run(ctx, input) {
    const write = await ctx.callWithWork({ role: "executor", node: "write", task: "Write NOTES.md: " + input.notes, schema: ${JSON.stringify(schemaOk)} });
    const review = await ctx.callWithWork({ role: "reviewer", node: "review", task: "Review NOTES.md", schema: ${JSON.stringify(schemaSeen)} });
    return { write, review };
  },
};
`;

let root: string;
let model: MockModel;
let codex: RealCodex;
/** The shell calls the threads made, by the call's marker, with what the real Codex answered. */
const shellCalls = new Map<string, { cmd: string; output: string }>();

const usage = { input: 500, output: 30 };
const answer = (value: unknown): ModelReply => ({
  items: [{ type: "message", text: JSON.stringify(value), phase: "final_answer" }],
  usage,
});
const outputBody = (out: string) =>
  out.includes("\nOutput:\n") ? out.slice(out.indexOf("\nOutput:\n") + 9) : out;

/**
 * A call's thread: its first request runs one command with exec_command in the thread's cwd (the
 * executor writes NOTES.md with its task's text; the reviewer prints its cwd, the file and its HEAD's
 * subject); the next request answers the JSON from the command's output.
 */
function threadReply(request: ModelRequest): ModelReply | undefined {
  const text = userTexts(request).find((t) => t.startsWith("crw-flow-op: ")) ?? "";
  const marker = /^crw-flow-op: (\S+)/.exec(text)?.[1] ?? "";
  const outputs = functionOutputs(request);
  if (outputs.length === 0) {
    const shell = (cmd: string): ModelReply => ({
      items: [
        {
          type: "function_call",
          name: "exec_command",
          callId: `shell_${marker}`,
          arguments: { cmd, login: false, yield_time_ms: 20_000 },
        },
      ],
      usage,
    });
    if (marker.startsWith("write.1/")) {
      const line = /^Write NOTES\.md: (.*)$/m.exec(text)?.[1] ?? "";
      return shell(`printf '%s\\n' ${JSON.stringify(line)} > NOTES.md`);
    }
    if (marker.startsWith("review.1/"))
      return shell("pwd && echo '--- notes' && cat NOTES.md && echo '--- head' && git log -1 --format=%s");
    return undefined;
  }
  const out = outputs.at(-1)?.output ?? "";
  shellCalls.set(marker, { cmd: String(functionCalls(request).at(-1)?.arguments), output: out });
  if (marker.startsWith("write.1/")) return answer({ ok: /Process exited with code 0/.test(out) });
  const [cwd = "", rest = ""] = outputBody(out).split("--- notes\n");
  const [seen = "", head = ""] = rest.split("--- head\n");
  return answer({ cwd: cwd.trim(), seen: seen.trim(), head: head.trim() });
}

beforeAll(async () => {
  ensureBuilt();
  root = mkdtempSync(join(tmpdir(), "crw-flow-as-branch-"));
  model = await MockModel.start();
  model.on((r) => r.parentThreadId === null, threadReply);
  codex = await startRealCodex({
    home: join(root, "codex-home"),
    cwd: root,
    baseUrl: model.baseUrl,
    models: ["mock-executor", "mock-reviewer"],
    listen: "ws",
  });
}, 120_000);

afterAll(async () => {
  await codex?.stop();
  await model?.stop();
  if (root && !process.env.CRW_KEEP_E2E) rmSync(root, { recursive: true, force: true });
});

type Row = JournalRow & Record<string, unknown>;

describe("--backend app-server: the run's branch with the real codex binary", () => {
  it("the executor's thread writes NOTES.md through Codex's shell in its worktree; crw commits it; the reviewer's thread has it in its cwd; land fast-forwards main", async () => {
    const { root: dir, repo, sh } = tempRepo("crw-flow-as-branch-repo-");
    try {
      mkdirSync(join(repo, ".crw"), { recursive: true });
      writeFileSync(
        join(repo, ".crw", "flow-roles.json"),
        JSON.stringify({
          roles: { executor: { model: "mock-executor" }, reviewer: { model: "mock-reviewer" } },
        }),
      );
      sh(repo, "add", "-A");
      sh(repo, "commit", "-q", "-m", "roles");
      const base = sh(repo, "rev-parse", "HEAD");
      const state = join(dir, "state");
      const workflow = join(dir, "branch.mjs");
      writeFileSync(workflow, workflowSource);
      const env: NodeJS.ProcessEnv = { ...process.env };
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
          "asb",
          "--repo",
          repo,
          "--input",
          JSON.stringify({ notes }),
          "--json",
        ],
        env,
        repo,
      );
      expect(start.code, start.stderr).toBe(0);
      expect(start.json()).toMatchObject({ backend: "app-server" });
      const journal = join(state, "flow", "asb", "journal.jsonl");
      const rows = (): Row[] => (existsSync(journal) ? (readJournalFile(journal).rows as Row[]) : []);
      const ended = await waitFor("the run to end", () => rows().find((r) => r.type === "run_ended"), 90_000);
      const all = rows();
      const trail = all.map((r) => `${r.type}${"call" in r ? ` ${r.call}` : ""}`).join("\n");
      expect(ended, trail).toMatchObject({ status: "completed" });
      const prepared = (call: string) =>
        all.find((r): r is RowOf<"prepared"> & Row => r.type === "prepared" && r.call === call);
      const completed = (call: string) =>
        all.find((r): r is RowOf<"completed"> & Row => r.type === "completed" && r.call === call);
      const thread = (call: string) =>
        all.find((r): r is RowOf<"thread_started"> & Row => r.type === "thread_started" && r.call === call);
      expect(all.find((r) => r.type === "run_branch")).toMatchObject({
        branch: "crw/flow/asb",
        base,
        from: "main",
      });

      // the executor's thread: its cwd, as the real server reports it, is the call's worktree at the base
      const writeAt = prepared("write.1")?.allocation;
      expect(writeAt).toMatchObject({ kind: "worktree", start: base });
      const writeDir = String(writeAt?.workspace);
      expect(thread("write.1")).toMatchObject({ via: "app-server", cwd: writeDir, host_cwd: writeDir });
      expect(shellCalls.get("write.1/t1-a1")?.output).toMatch(/Process exited with code 0/);
      // crw's commit of what the thread wrote, on the start, and the branch moved to it
      const work = completed("write.1")?.work;
      const commit = String(work?.commit);
      expect(work).toEqual({ start: base, commit, paths: ["NOTES.md"] });
      expect(all.find((r) => r.type === "commit_intended" && r.call === "write.1")).toMatchObject({
        commit,
        parent: base,
        paths: ["NOTES.md"],
      });
      expect(sh(repo, "rev-parse", "crw/flow/asb")).toBe(commit);
      expect(sh(repo, "rev-parse", `${commit}^`)).toBe(base);
      expect(sh(repo, "log", "-1", "--format=%s", commit)).toBe(executorSubject);
      expect(sh(repo, "show", `${commit}:NOTES.md`)).toBe(notes);
      // main's checkout has nothing yet
      expect(existsSync(join(repo, "NOTES.md"))).toBe(false);
      expect(sh(repo, "rev-parse", "main")).toBe(base);

      // the reviewer's thread: cwd its own worktree at the executor's commit, where its shell read the file
      const reviewAt = prepared("review.1")?.allocation;
      expect(reviewAt).toMatchObject({ kind: "worktree", start: commit });
      const reviewDir = String(reviewAt?.workspace);
      expect(reviewDir).not.toBe(writeDir);
      expect(thread("review.1")).toMatchObject({ via: "app-server", cwd: reviewDir, host_cwd: reviewDir });
      expect(sh(reviewDir, "rev-parse", "HEAD")).toBe(commit);
      expect(readFileSync(join(reviewDir, "NOTES.md"), "utf8")).toBe(`${notes}\n`);
      expect(outputBody(String(shellCalls.get("review.1/t1-a1")?.output))).toBe(
        `${reviewDir}\n--- notes\n${notes}\n--- head\n${executorSubject}\n`,
      );
      expect(completed("review.1")?.work).toEqual({ start: commit, commit: null, paths: [] });
      expect(ended).toMatchObject({
        result: {
          write: { op: "write.1", answer: { ok: true }, work: { start: base, commit, paths: ["NOTES.md"] } },
          review: {
            op: "review.1",
            answer: { cwd: reviewDir, seen: notes, head: executorSubject },
            work: { start: commit, commit: null, paths: [] },
          },
        },
      });

      // the land: a fast-forward of main; its checkout has the file and is clean
      const show = await crwFlow(["show", "asb", "--state", state, "--json"]);
      expect(show.code, show.stderr).toBe(0);
      expect(show.json().branch).toMatchObject({
        name: "crw/flow/asb",
        tip: commit,
        commits: [{ call: "write.1", role: "executor", commit, paths: ["NOTES.md"] }],
        landed: false,
      });
      const land = await crwFlow(["land", "asb", "--state", state, "--json"]);
      expect(land.code, land.stderr).toBe(0);
      expect(land.json()).toMatchObject({
        branch: "crw/flow/asb",
        into: "main",
        before: base,
        after: commit,
        fast_forward: true,
        changed_paths: ["NOTES.md"],
      });
      expect(sh(repo, "rev-parse", "main")).toBe(commit);
      expect(readFileSync(join(repo, "NOTES.md"), "utf8")).toBe(`${notes}\n`);
      expect(sh(repo, "status", "--porcelain")).toBe("");
    } finally {
      if (!process.env.CRW_KEEP_E2E) rmSync(dir, { recursive: true, force: true });
    }
  }, 150_000);
});
