import { execFileSync } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { readJournalFile } from "../../src/journal/journal.js";
import type { JournalRow, RowOf } from "../../src/journal/rows.js";
import { pidAlive } from "../../src/util/liveness.js";
import { crwFlow, ensureBuilt, waitFor } from "../helpers/cli.js";
import { tempRepo } from "./repo.js";

/**
 * Crash injection at the run branch's boundaries: the run process SIGKILLs itself right after a row
 * (CRW_FLOW_FAULT), `crw flow resume` finishes the run, and the branch must come out as the uninterrupted
 * run's: the same tree, the same number of commits, each executor call committed once.
 */
const done = { type: "object", required: ["ok"], properties: { ok: { type: "boolean" } } };
const workflow = `
const done = ${JSON.stringify(done)};
export default {
  name: "branch-crash",
  async run(ctx) {
    await ctx.call({ role: "executor", node: "first", task: "write notes", schema: done });
    const parallel = await Promise.all(
      ["left", "right"].map((node) => ctx.callWithWork({ role: "executor", node, task: "write " + node, schema: done })),
    );
    const review = await ctx.callWithWork({ role: "reviewer", node: "review", task: "review", schema: done });
    return { paths: parallel.map((p) => p.work.paths), reviewed: review.work.start === null ? null : "branch" };
  },
};
`;
const writes = (path: string, content: string) => [
  { toolCalls: [{ name: "write", arguments: { path, content } }] },
  { text: '{"ok":true}' },
];
const script = {
  calls: {
    "first.1": writes("NOTES.md", "# notes\n"),
    "left.1": writes("left.txt", "left\n"),
    "right.1": writes("right.txt", "right\n"),
    "review.1": [{ text: '{"ok":true}' }],
  },
};

interface Outcome {
  rows: JournalRow[];
  killed: boolean;
  result: unknown;
  tree: string;
  commits: number;
}

async function runOnce(fault: string | null, n: number): Promise<Outcome> {
  const { root, repo, start: base } = tempRepo("crw-flow-branch-crash-");
  const state = join(root, "state");
  const wf = join(root, "wf.mjs");
  writeFileSync(wf, workflow);
  const scriptFile = join(root, "script.json");
  writeFileSync(scriptFile, JSON.stringify(script));
  const env = { ...process.env };
  delete env.CODEX_THREAD_ID;
  delete env.CRW_FLOW_FAULT;
  const run = `r${n}`;
  const journal = join(state, "flow", run, "journal.jsonl");
  const rows = () => (existsSync(journal) ? readJournalFile(journal).rows : []);
  const ended = () => rows().some((r) => r.type === "run_ended");
  const start = await crwFlow(
    ["start", wf, "--repo", repo, "--state", state, "--run", run, "--script", scriptFile, "--json"],
    fault ? { ...env, CRW_FLOW_FAULT: fault } : env,
  );
  expect(start.code, start.stderr).toBe(0);
  const pid = Number(start.json().pid);
  await waitFor(`${run} to end or die`, () => ended() || !pidAlive(pid), 60_000);
  let killed = false;
  if (!ended()) {
    killed = true;
    const resumed = await crwFlow(["resume", run, "--state", state, "--json"], env);
    const said = resumed.stderr
      .split("\n")
      .filter((l) => !l.includes('"msg":"event"'))
      .join("\n");
    expect(resumed.code, `${fault}: ${said}\n${resumed.stdout}`).toBe(0);
  }
  await waitFor(`${run} to end`, ended, 60_000);
  const git = (...args: string[]) => execFileSync("git", args, { cwd: repo, encoding: "utf8" }).trim();
  const last = rows().at(-1);
  return {
    rows: rows(),
    killed,
    result: last?.type === "run_ended" ? last.result : undefined,
    tree: git("rev-parse", `crw/flow/${run}^{tree}`),
    commits: Number(git("rev-list", "--count", `${base}..crw/flow/${run}`)),
  };
}

let reference: Outcome;
beforeAll(async () => {
  ensureBuilt();
  reference = await runOnce(null, 0);
}, 180_000);

describe("crash injection at the run branch's boundaries", () => {
  it("the uninterrupted run: three executor commits and the merge the reviewer starts from", () => {
    expect(reference.result).toEqual({ paths: [["left.txt"], ["right.txt"]], reviewed: "branch" });
    expect(reference.commits).toBe(4);
    expect(reference.rows.filter((r) => r.type === "commit_intended")).toHaveLength(3);
  });

  it("a SIGKILL right after the branch row, each commit intent, each executor's completed row or the merge resumes to the same branch, no call committed twice", async () => {
    const points = [
      "after:run_branch:1",
      "after:commit_intended:1",
      "after:commit_intended:2",
      "after:commit_intended:3",
      "after:completed:1",
      "after:completed:3",
      "after:branch_merged:1",
      "after:prepared:4",
    ];
    let n = 1;
    const queue = points.map((p) => ({ point: p, n: n++ }));
    const check = async ({ point, n }: { point: string; n: number }) => {
      const out = await runOnce(point, n);
      expect(out.killed, `${point}: not killed`).toBe(true);
      expect(out.result, point).toEqual(reference.result);
      expect(out.tree, point).toBe(reference.tree);
      expect(out.commits, point).toBe(reference.commits);
      const intents = out.rows.filter((r): r is RowOf<"commit_intended"> => r.type === "commit_intended");
      expect(intents.map((r) => r.call).sort(), point).toEqual(["first.1", "left.1", "right.1"]);
      for (const i of intents) {
        const c = out.rows.find((r): r is RowOf<"completed"> => r.type === "completed" && r.call === i.call);
        expect(c?.work?.commit, `${point}: ${i.call}`).toBe(i.commit);
      }
      expect(
        out.rows.filter((r) => r.type === "branch_merged"),
        point,
      ).toHaveLength(1);
      expect(
        out.rows.filter((r) => r.type === "run_branch"),
        point,
      ).toHaveLength(1);
      // no subagent moved HEAD: a resume after crw's intent must not take crw's own HEAD move for one
      const moved = out.rows.filter((r) => r.type === "completed" && r.executor_head_moved);
      expect(moved, point).toEqual([]);
    };
    await Promise.all(
      [0, 1].map(async () => {
        for (let p = queue.shift(); p !== undefined; p = queue.shift()) await check(p);
      }),
    );
  }, 300_000);
});
