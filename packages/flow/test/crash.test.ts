import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  evidenceRecordPath,
  type JournalRow,
  listStepFiles,
  pidAlive,
  readJournalFile,
  runPaths,
} from "@crw/flow";
import { FakeAppServer } from "@crw/tools/codex";
import { type Behave, checkResumedRun, faultPointsOf, fileStepSource, ScriptedOwner } from "@crw/tools/flow";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { crwFlow, ensureBuilt, waitFor } from "./helpers/cli.js";

/**
 * Crash injection: the run process kills itself (SIGKILL) after each journal boundary of a scripted run
 * in turn; the run is resumed (`crw flow resume --detach`) and must end with the uninterrupted run's
 * result, no call completed twice and no step published twice. The run has an evidence cwd (`--evidence`)
 * and a gated executor call, so its flow evidence record's evidence_placed row is a boundary too; the
 * record lives under the owner's cwd and is released when the run ends. The run's repository is a git
 * checkout, so the run branch's rows (run_branch, commit_intended) are boundaries too, and the branch must
 * come out as the reference's: the executor's file committed once.
 */
const workflowSource = `
const schema = { type: "object", required: ["n"], properties: { n: { type: "integer" } }, additionalProperties: false };
export default {
  name: "crash",
  async run(ctx, input) {
    const [a, b] = await Promise.all([
      ctx.call({ role: "explorer", task: "count A", schema }),
      ctx.call({ role: "reviewer", task: "count B", schema }),
    ]);
    const c = await ctx.call({ role: "executor", task: "sum " + (a.n + b.n), schema });
    return { a: a.n, b: b.n, c: c.n, base: input.base };
  },
};
`;

/** Deterministic subagents: the explorer answers invalid JSON on its first turn, so the repair runs. */
const behave: Behave = (step) => {
  if (step.call === "explorer.1" && step.k === 1) {
    return {
      kind: "answer",
      messages: [{ text: "seven, I think", phase: "final_answer" }],
      usage: { input: 30, output: 3 },
    };
  }
  const n = step.call === "explorer.1" ? 7 : step.call === "reviewer.1" ? 5 : 12; // executor.1: 12
  // the executor's subagent writes a file in its worktree: crw commits it onto the run's branch
  if (step.call === "executor.1" && step.workspace) writeFileSync(join(step.workspace, "sum.txt"), `${n}\n`);
  return {
    kind: "answer",
    messages: [{ text: JSON.stringify({ n }), phase: "final_answer" }],
    usage: { input: 20, output: 2 },
  };
};

let fake: FakeAppServer;
let root: string;
let env: NodeJS.ProcessEnv;
let workflowPath: string;
let reference: { result: unknown; rows: JournalRow[]; record: string; branch: Branch };
let seq = 0;

beforeAll(async () => {
  ensureBuilt();
  root = mkdtempSync(join(tmpdir(), "crw-flow-crash-"));
  fake = await FakeAppServer.start();
  env = { ...process.env, CRW_FLOW_HOST: fake.url, CODEX_HOME: join(root, "codex-home") };
  delete env.CRW_FLOW_FAULT;
  workflowPath = join(root, "crash.mjs");
  writeFileSync(workflowPath, workflowSource);
  reference = await runOnce(null);
}, 120_000);

afterAll(async () => {
  await fake?.stop();
  rmSync(root, { recursive: true, force: true });
});

async function runOnce(fault: string | null): Promise<{
  result: unknown;
  rows: JournalRow[];
  killed: boolean;
  log: string;
  leftSteps: number;
  /** At the kill: the journal's last row type and whether the executor's evidence record existed. */
  atKill: { last: string | undefined; record: boolean } | null;
  record: string;
  branch: Branch;
}> {
  const runId = `crash-${seq++}`;
  const repo = gitRepo(join(root, `repo-${runId}`));
  const state = join(root, "state");
  const paths = runPaths(state, runId);
  // a fresh owner thread per run: the host's marker lookups list this run's subagents only
  const owner = fake.createOwnerThread({ cwd: root });
  fake.startOwnerTurn(owner);
  const runEnv = { ...env, CODEX_THREAD_ID: owner };
  const startEnv = fault ? { ...runEnv, CRW_FLOW_FAULT: fault } : runEnv;
  const kit = new ScriptedOwner({
    fake,
    owner,
    source: fileStepSource({ state, runId, replyWaitMs: 300 }),
    behave,
  });
  const r = await crwFlow(
    [
      "start",
      workflowPath,
      "--run",
      runId,
      "--state",
      state,
      "--input",
      '{"base":1}',
      "--poll-ms",
      "20",
      "--evidence",
      "--repo",
      repo,
      "--json",
    ],
    startEnv,
    root,
  );
  if (r.code !== 0) throw new Error(`start failed: ${r.stderr}`);
  const pid = Number(r.json().pid);
  kit.start();
  const ended = () =>
    existsSync(paths.journal) && readJournalFile(paths.journal).rows.some((x) => x.type === "run_ended");
  let killed = false;
  const record = evidenceRecordPath(root, `flow:${runId}/executor.1/g1`);
  let atKill: { last: string | undefined; record: boolean } | null = null;
  try {
    await waitFor(`run ${runId} to end or its process to die`, () => !pidAlive(pid) || ended(), 30_000);
    if (!ended()) {
      killed = true;
      atKill = { last: readJournalFile(paths.journal).rows.at(-1)?.type, record: existsSync(record) };
      const res = await crwFlow(["resume", runId, "--detach", "--state", state, "--json"], runEnv);
      if (res.code !== 0) throw new Error(`resume failed: ${res.stderr}`);
      await waitFor(`resumed run ${runId} to end`, ended, 30_000);
    }
    // the process that ended the run lets its run lock go once it is done (after the release)
    await waitFor(`run ${runId}'s process to let the run go`, () => !existsSync(paths.runLock), 10_000);
  } finally {
    await kit.stop();
  }
  const rows = readJournalFile(paths.journal).rows;
  const last = rows.at(-1);
  const log = existsSync(paths.log) ? readFileSync(paths.log, "utf8") : "";
  const leftSteps = listStepFiles(paths.steps).steps.length;
  return {
    result: last?.type === "run_ended" ? last.result : undefined,
    rows,
    killed,
    log,
    leftSteps,
    atKill,
    record,
    branch: branchOf(repo, runId),
  };
}

interface Branch {
  tree: string;
  commits: number;
  files: string;
}

const git = (cwd: string, ...args: string[]) =>
  execFileSync("git", args, {
    cwd,
    encoding: "utf8",
    env: {
      ...process.env,
      GIT_AUTHOR_NAME: "t",
      GIT_AUTHOR_EMAIL: "t@t",
      GIT_COMMITTER_NAME: "t",
      GIT_COMMITTER_EMAIL: "t@t",
    },
  }).trim();

function gitRepo(dir: string): string {
  mkdirSync(dir, { recursive: true });
  git(dir, "init", "-q", "-b", "main");
  writeFileSync(join(dir, "README.md"), "crash\n");
  git(dir, "add", "-A");
  git(dir, "commit", "-q", "-m", "start");
  return dir;
}

/** The run's branch: its tree, how many commits it has over main, and its files. */
function branchOf(repo: string, runId: string): Branch {
  const ref = `crw/flow/${runId}`;
  return {
    tree: git(repo, "rev-parse", `${ref}^{tree}`),
    commits: Number(git(repo, "rev-list", "--count", `main..${ref}`)),
    files: git(repo, "ls-tree", "-r", "--name-only", ref),
  };
}

function tokensByCall(rows: JournalRow[]): Record<string, unknown> {
  return Object.fromEntries(rows.flatMap((r) => (r.type === "completed" ? [[r.call, r.tokens]] : [])));
}

describe("crash injection at every journal boundary", () => {
  it("the uninterrupted run (the reference) repairs once and ends completed", () => {
    expect(reference.result).toEqual({ a: 7, b: 5, c: 12, base: 1 });
    expect(reference.rows.filter((r) => r.type === "evidence_placed")).toHaveLength(1);
    expect(existsSync(reference.record)).toBe(false);
    expect(reference.rows.filter((r) => r.type === "step_published")).toHaveLength(4);
    expect(reference.branch).toMatchObject({ commits: 1, files: "README.md\nsum.txt" });
  });

  it("S000-169 S000-097 S000-137 S000-138 S000-139 S000-140 S000-141 S000-142 S000-145 S000-146 S000-147: a SIGKILL after any row resumes to the same result, nothing twice", async () => {
    // Every boundary, three at a time (about 25 s here); CRW_CRASH_ONLY=<point> runs one.
    const only = process.env.CRW_CRASH_ONLY;
    // a wake's rows depend on the owner's timing (a busy owner's wake is recorded only when it goes out):
    // only their first boundary is a point every run reaches
    const timed = /^after:(session_wake|message_delivery):(?!1$)/;
    const all = faultPointsOf(reference.rows).filter(
      (p) => !p.startsWith("after:run_ended") && !timed.test(p),
    );
    const points = only ? [only] : all;
    expect(all.length).toBeGreaterThan(15);
    // three points at a time: each has its own run and owner thread on the shared fake host
    const check = async (point: string) => {
      let out = await runOnce(point);
      // The checkout is shared: a rebuild of dist/ under a starting process is not this test's subject.
      if (out.log.includes("ERR_MODULE_NOT_FOUND")) out = await runOnce(point);
      expect(out.killed, `${point}: the process was not killed`).toBe(true);
      expect(out.result, point).toEqual(reference.result);
      expect(out.leftSteps, `${point}: a step file was left (not retracted)`).toBe(0);
      // S000-169 S000-171: evidence_placed is committed before the record is written (a process killed
      // right after it leaves no record yet); the resumed run restores or writes it, and its end releases
      // every copy the rows name
      if (point.startsWith("after:evidence_placed:"))
        expect(out.atKill, point).toEqual({ last: "evidence_placed", record: false });
      expect(existsSync(out.record), `${point}: the evidence record was not released`).toBe(false);
      expect(
        out.rows.filter((r) => r.type === "evidence_placed"),
        point,
      ).toHaveLength(1);
      // tokens: a recovered turn counts only what it adds (tokens_seen, call_tokens of its step row)
      expect(tokensByCall(out.rows), point).toEqual(tokensByCall(reference.rows));
      // the same branch as the uninterrupted run's, the executor committed once
      expect(out.branch, point).toEqual(reference.branch);
      expect(
        out.rows.filter((r) => r.type === "commit_intended"),
        point,
      ).toHaveLength(1);
      expect(checkResumedRun(out.rows), point).toEqual({
        completedTwice: [],
        publishedTwice: [],
        terminalTwice: [],
      });
      expect(
        out.rows.filter((r) => r.type === "started"),
        `${point}: ${out.rows.map((r) => r.type).join(" ")}\n${out.log
          .split("\n")
          .filter((l) => !l.includes('"msg":"event"'))
          .join("\n")}`,
      ).toHaveLength(2);
    };
    const queue = [...points];
    await Promise.all(
      [0, 1, 2].map(async () => {
        for (let p = queue.shift(); p !== undefined; p = queue.shift()) await check(p);
      }),
    );
  }, 240_000);
});
