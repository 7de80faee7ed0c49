import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { readJournalFile } from "../../src/journal/journal.js";
import type { JournalRow, RowOf } from "../../src/journal/rows.js";
import { crwFlow, ensureBuilt, waitFor } from "../helpers/cli.js";
import { tempRepo } from "./repo.js";

/**
 * The run's branch through the built CLI on the local backend (crw's own agent loop, the scripted model
 * calling the real write tool): each executor's change is committed onto `crw/flow/<run>`, the next call
 * starts from it, parallel executors are merged before the call after them, and `crw flow land` brings
 * the branch onto the user's branch.
 */
const done = { type: "object", required: ["ok"], properties: { ok: { type: "boolean" } } };
const writes = (path: string, content: string) => [
  { toolCalls: [{ name: "write", arguments: { path, content } }] },
  { text: '{"ok":true}' },
];
const reads = (path: string) => [
  { toolCalls: [{ name: "read", arguments: { path } }] },
  { text: '{"ok":true}' },
];

const workflow = `
const done = ${JSON.stringify(done)};
export default {
  name: "branch",
  async run(ctx, input) {
    const first = await ctx.callWithWork({ role: "executor", node: "first", task: "write notes", schema: done });
    const parallel = await Promise.all(
      input.parallel.map((name) =>
        ctx.callWithWork({ role: "executor", node: name, task: "write " + name, schema: done }),
      ),
    );
    let review;
    try {
      review = await ctx.callWithWork({ role: "reviewer", node: "review", task: "review", schema: done });
    } catch (e) {
      review = { error: e.reason, details: e.details, message: e.message };
    }
    return { first, parallel, review };
  },
};
`;

interface Run {
  root: string;
  repo: string;
  base: string;
  state: string;
  sh: (cwd: string, ...args: string[]) => string;
  rows: () => JournalRow[];
  result: () => Record<string, unknown>;
}

async function runBranchWorkflow(
  runId: string,
  parallel: string[],
  script: Record<string, unknown[]>,
): Promise<Run> {
  const { root, repo, start: base, sh } = tempRepo("crw-flow-branch-");
  const state = join(root, "state");
  const wf = join(root, "branch.workflow.mjs");
  writeFileSync(wf, workflow);
  const scriptFile = join(root, "script.json");
  writeFileSync(scriptFile, JSON.stringify({ calls: script }));
  const env = { ...process.env };
  delete env.CODEX_THREAD_ID;
  delete env.CRW_FLOW_FAULT;
  const r = await crwFlow(
    [
      "start",
      wf,
      "--repo",
      repo,
      "--state",
      state,
      "--run",
      runId,
      "--script",
      scriptFile,
      "--input",
      JSON.stringify({ parallel }),
      "--json",
    ],
    env,
  );
  expect(r.code, r.stderr).toBe(0);
  const journal = join(state, "flow", runId, "journal.jsonl");
  const rows = () => (existsSync(journal) ? readJournalFile(journal).rows : []);
  const ended = await waitFor(`${runId} to end`, () => rows().find((x) => x.type === "run_ended"), 60_000);
  expect(ended).toMatchObject({ status: "completed" });
  const result = () =>
    (rows().find((x) => x.type === "run_ended") as RowOf<"run_ended">).result as Record<string, unknown>;
  return { root, repo, base, state, sh, rows, result };
}

const prepared = (rows: JournalRow[], call: string) =>
  rows.find((r): r is RowOf<"prepared"> => r.type === "prepared" && r.call === call);
const completed = (rows: JournalRow[], call: string) =>
  rows.find((r): r is RowOf<"completed"> => r.type === "completed" && r.call === call);

beforeAll(() => ensureBuilt(), 180_000);

describe("the run's branch", () => {
  it("an executor's change is committed onto the run branch, the next call's checkout starts from it, and ctx.callWithWork tells the commit and paths", async () => {
    const run = await runBranchWorkflow("seq", [], {
      "first.1": writes("NOTES.md", "# notes\n"),
      "review.1": reads("NOTES.md"),
    });
    const rows = run.rows();
    const commit = completed(rows, "first.1")?.work?.commit as string;
    expect(completed(rows, "first.1")?.work).toEqual({ start: run.base, commit, paths: ["NOTES.md"] });
    // one commit, crw's, on the start, naming the call and its role
    expect(run.sh(run.repo, "rev-list", "--count", `${run.base}..crw/flow/seq`)).toBe("1");
    expect(run.sh(run.repo, "rev-parse", "crw/flow/seq")).toBe(commit);
    expect(run.sh(run.repo, "log", "-1", "--format=%s%n%an", commit)).toBe(
      "crw flow: first.1 (executor)\ncrw flow",
    );
    expect(run.sh(run.repo, "show", `${commit}:NOTES.md`)).toBe("# notes");
    // the reviewer's checkout started from the executor's commit: its read tool saw NOTES.md
    const review = prepared(rows, "review.1");
    expect(review?.allocation).toMatchObject({ kind: "worktree", start: commit });
    expect(run.sh(String(review?.allocation.workspace), "show", "HEAD:NOTES.md")).toBe("# notes");
    // a reviewer commits nothing; it is told what it started from
    expect(completed(rows, "review.1")?.work).toEqual({ start: commit, commit: null, paths: [] });
    // what the workflow was given is what the rows say
    expect(run.result()).toMatchObject({
      first: { op: "first.1", answer: { ok: true }, work: { start: run.base, commit, paths: ["NOTES.md"] } },
      review: { op: "review.1", work: { start: commit, commit: null } },
    });
    // the user's branch is untouched until the run lands
    expect(run.sh(run.repo, "rev-parse", "main")).toBe(run.base);

    const show = await crwFlow(["show", "seq", "--state", run.state, "--json"]);
    expect(show.code, show.stderr).toBe(0);
    expect(show.json().branch).toMatchObject({
      name: "crw/flow/seq",
      base: run.base,
      from: "main",
      tip: commit,
      commits: [{ call: "first.1", role: "executor", commit, paths: ["NOTES.md"] }],
      landed: false,
    });
    const human = await crwFlow(["show", "seq", "--state", run.state]);
    expect(human.stdout).toContain(`branch crw/flow/seq at ${commit.slice(0, 12)} (from main`);

    const land = await crwFlow(["land", "seq", "--state", run.state, "--json"]);
    expect(land.code, land.stderr).toBe(0);
    expect(land.json()).toMatchObject({
      branch: "crw/flow/seq",
      into: "main",
      before: run.base,
      after: commit,
      fast_forward: true,
      changed_paths: ["NOTES.md"],
    });
    // the calls' worktrees are gone, from the disk and from the repository's list
    expect(land.json().worktrees).toEqual({ removed: 2, kept: [] });
    expect(run.sh(run.repo, "worktree", "list", "--porcelain").match(/^worktree /gm)).toHaveLength(1);
    // main's checkout has the file, and is clean
    expect(run.sh(run.repo, "rev-parse", "HEAD")).toBe(commit);
    expect(run.sh(run.repo, "status", "--porcelain")).toBe("");
    expect((await crwFlow(["show", "seq", "--state", run.state, "--json"])).json().branch).toMatchObject({
      landed: true,
    });
    // landing again changes nothing
    const again = await crwFlow(["land", "seq", "--state", run.state, "--json"]);
    expect(again.json()).toMatchObject({ already_landed: true, after: commit });
  }, 120_000);

  it("parallel executors commit on their own refs and the next call starts from their merge; landing on a moved branch makes a merge commit", async () => {
    const run = await runBranchWorkflow("par", ["left", "right"], {
      "first.1": writes("NOTES.md", "# notes\n"),
      "left.1": writes("left.txt", "left\n"),
      "right.1": writes("right.txt", "right\n"),
      "review.1": reads("left.txt"),
    });
    const rows = run.rows();
    const first = completed(rows, "first.1")?.work?.commit as string;
    const left = completed(rows, "left.1")?.work;
    const right = completed(rows, "right.1")?.work;
    // both started from the first executor's commit
    expect(left).toMatchObject({ start: first, paths: ["left.txt"] });
    expect(right).toMatchObject({ start: first, paths: ["right.txt"] });
    expect(run.sh(run.repo, "rev-parse", "refs/crw/flow/par/calls/left.1")).toBe(left?.commit);
    expect(run.sh(run.repo, "rev-parse", "refs/crw/flow/par/calls/right.1")).toBe(right?.commit);
    // the merge is recorded before the reviewer's prepared row, and the reviewer starts from it
    const merged = rows.find((r): r is RowOf<"branch_merged"> => r.type === "branch_merged");
    expect(merged?.for_call).toBe("review.1");
    expect(new Set(merged?.heads)).toEqual(new Set([left?.commit, right?.commit]));
    expect(merged?.seq).toBeLessThan(prepared(rows, "review.1")?.seq ?? -1);
    expect(prepared(rows, "review.1")?.allocation.start).toBe(merged?.commit);
    const reviewDir = String(prepared(rows, "review.1")?.allocation.workspace);
    expect(run.sh(reviewDir, "ls-files").split("\n").sort()).toEqual([
      "NOTES.md",
      "a.txt",
      "left.txt",
      "right.txt",
    ]);
    expect(run.sh(run.repo, "rev-parse", "crw/flow/par")).toBe(merged?.commit);

    // the user commits on main meanwhile: the land is a merge commit, never a force
    writeFileSync(join(run.repo, "user.txt"), "mine\n");
    run.sh(run.repo, "add", "user.txt");
    run.sh(run.repo, "commit", "-q", "-m", "user");
    const userTip = run.sh(run.repo, "rev-parse", "main");
    const land = await crwFlow(["land", "par", "--state", run.state, "--json"]);
    expect(land.code, land.stderr).toBe(0);
    expect(land.json()).toMatchObject({ fast_forward: false, before: userTip });
    const after = String(land.json().after);
    expect(run.sh(run.repo, "rev-list", "--parents", "-1", after).split(" ").slice(1)).toEqual([
      userTip,
      merged?.commit,
    ]);
    expect(run.sh(run.repo, "ls-files").split("\n").sort()).toEqual([
      "NOTES.md",
      "a.txt",
      "left.txt",
      "right.txt",
      "user.txt",
    ]);
  }, 120_000);

  it("parallel executors that change one file differently: the call after them ends with merge_conflict naming the path, and the run's branch does not land", async () => {
    const run = await runBranchWorkflow("clash", ["left", "right"], {
      "first.1": writes("NOTES.md", "# notes\n"),
      "left.1": writes("NOTES.md", "# left\n"),
      "right.1": writes("NOTES.md", "# right\n"),
    });
    const rows = run.rows();
    expect(run.result().review).toMatchObject({ error: "merge_conflict", details: ["NOTES.md"] });
    expect(rows.find((r) => r.type === "null_model" && r.call === "review.1")).toMatchObject({
      reason: "merge_conflict",
      errors: ["NOTES.md"],
    });
    // no subagent was asked for the call that could not start
    expect(rows.some((r) => r.type === "thread_started" && r.call === "review.1")).toBe(false);
    expect(rows.find((r) => r.type === "branch_unmerged")).toMatchObject({ paths: ["NOTES.md"] });
    const land = await crwFlow(["land", "clash", "--state", run.state, "--json"]);
    expect(land.code).toBe(1);
    expect(land.json()).toMatchObject({ error: { code: "merge_conflict" } });
    expect(land.stderr).toContain("NOTES.md");
    expect(run.sh(run.repo, "rev-parse", "main")).toBe(run.base);
  }, 120_000);

  it("a land that conflicts with the user's branch refuses, names the paths and changes nothing", async () => {
    const run = await runBranchWorkflow("theirs", [], {
      "first.1": writes("a.txt", "from the run\n"),
      "review.1": reads("a.txt"),
    });
    writeFileSync(join(run.repo, "a.txt"), "from the user\n");
    run.sh(run.repo, "commit", "-q", "-am", "user");
    const userTip = run.sh(run.repo, "rev-parse", "main");
    const land = await crwFlow(["land", "theirs", "--state", run.state]);
    expect(land.code).toBe(1);
    expect(land.stderr).toMatch(/conflicts with main in a\.txt: nothing was landed/);
    expect(run.sh(run.repo, "rev-parse", "main")).toBe(userTip);
    expect(run.sh(run.repo, "status", "--porcelain")).toBe("");
    // landing elsewhere works: a new branch at the run's base takes it as a fast-forward
    run.sh(run.repo, "branch", "side", run.base);
    // a reviewer that wrote a file nobody committed keeps its worktree
    const reviewDir = String(prepared(run.rows(), "review.1")?.allocation.workspace);
    writeFileSync(join(reviewDir, "scratch.txt"), "left by a read role\n");
    const side = await crwFlow(["land", "theirs", "--into", "side", "--state", run.state, "--json"]);
    expect(side.code, side.stderr).toBe(0);
    expect(side.json()).toMatchObject({
      into: "side",
      fast_forward: true,
      updated_worktree: null,
      worktrees: { removed: 1, kept: [reviewDir] },
    });
  }, 120_000);
});
