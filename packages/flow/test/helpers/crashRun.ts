import { execFileSync } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  evidenceRecordPath,
  type JournalRow,
  listStepFiles,
  markerInText,
  pidAlive,
  type RunPaths,
  readJournalFile,
  readReply,
  runPaths,
} from "@crw/flow";
import { FakeAppServer } from "@crw/tools/codex";
import { type Behave, fileStepSource, ScriptedOwner } from "@crw/tools/flow";
import { crwFlow, ensureBuilt, waitFor } from "./cli.js";

/**
 * A scripted run of crw flow in its own process, killed by SIGKILL at a journal boundary
 * (`CRW_FLOW_FAULT=after:<row>:<n>`) and resumed (`crw flow resume --detach`), with what the disk and the
 * host held at the kill and at the end. The run has an evidence cwd (`--evidence`) and a gated executor
 * call, and its repository is a git checkout (the run branch's rows are boundaries too).
 */
export const workflowSource = `
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
export const behave: Behave = (step) => {
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

/** The owner's subagents on the host: each with the markers its turns carried, in order. */
export interface HostView {
  subagents: Array<{ id: string; markers: Array<string | null> }>;
}

export interface AtKill {
  last: JournalRow | undefined;
  /** Whether the executor's evidence record existed. */
  record: boolean;
  /** The step files left on disk. */
  steps: Array<{ call: string; k: number; marker: string }>;
  /** Dispatch reports no process answered. */
  unanswered: string[];
  /** Whether each step row's packet file existed, by marker. */
  packets: Record<string, boolean>;
  host: HostView;
}

export interface Branch {
  tree: string;
  commits: number;
  files: string;
}

export interface CrashOutcome {
  point: string | null;
  /** The owner thread the run was started for. */
  owner: string;
  result: unknown;
  rows: JournalRow[];
  /** Rows the killed process wrote (before the second started row), and those of the resumed one. */
  deadRows: JournalRow[];
  resumedRows: JournalRow[];
  killed: boolean;
  log: string;
  leftSteps: number;
  atKill: AtKill | null;
  record: string;
  branch: Branch;
  host: HostView;
  /** Every reply the run wrote, by report name. */
  replies: Record<string, string>;
}

/** What a test does while the run's process is dead, before the resume. */
export type WhileDead = (dead: {
  fake: FakeAppServer;
  owner: string;
  paths: RunPaths;
  rows: JournalRow[];
}) => Promise<void> | void;

export interface CrashRunOptions {
  whileDead?: WhileDead;
  /** The subagents' turns (default: `behave`). */
  behave?: Behave;
  /** More options of `crw flow start`. */
  startArgs?: string[];
  /** Variables set or changed in the environment of `crw flow resume` (the run's own are the default). */
  resumeEnv?: NodeJS.ProcessEnv;
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

export function hostView(fake: FakeAppServer, owner: string): HostView {
  const subagents = [...fake.state.threads.values()]
    .filter((t) => t.thread.parentThreadId === owner)
    .map((t) => ({
      id: t.thread.id,
      markers: t.turns.map((turn) => {
        const first = turn.items.find((i) => i.type === "userMessage");
        const text =
          first && "content" in first
            ? (first.content as Array<{ type: string; text?: string }>).map((c) => c.text ?? "").join("")
            : "";
        return markerInText(text);
      }),
    }));
  return { subagents };
}

function repliesOf(paths: RunPaths): Record<string, string> {
  let names: string[] = [];
  try {
    names = readdirSync(paths.replies).filter((n) => n.endsWith(".json"));
  } catch {
    // no reply was ever written
  }
  return Object.fromEntries(names.map((n) => [n, readReply(paths.replies, n)?.reply ?? "unreadable"]));
}

function unanswered(paths: RunPaths): string[] {
  let names: string[] = [];
  try {
    names = readdirSync(paths.inbox).filter((n) => n.endsWith(".json") && !n.startsWith("."));
  } catch {
    return [];
  }
  const answered = new Set(Object.keys(repliesOf(paths)));
  return names.filter((n) => !answered.has(n)).sort();
}

/** The journal's row types and the end of the process log: what a run that did not end was doing. */
function runReport(paths: RunPaths): string {
  const rows = existsSync(paths.journal) ? readJournalFile(paths.journal).rows : [];
  const log = existsSync(paths.log) ? readFileSync(paths.log, "utf8") : "";
  const lines = log.split("\n").filter((l) => l && !l.includes('"msg":"event"'));
  return `rows: ${rows.map((r) => ("call" in r ? `${r.type}(${r.call})` : r.type)).join(" ")}\nlog:\n${lines.slice(-30).join("\n")}`;
}

export class CrashHarness {
  private seq = 0;

  private constructor(
    readonly fake: FakeAppServer,
    readonly root: string,
    private readonly env: NodeJS.ProcessEnv,
    private readonly workflowPath: string,
  ) {}

  static async start(prefix: string): Promise<CrashHarness> {
    ensureBuilt();
    const root = mkdtempSync(join(tmpdir(), prefix));
    const fake = await FakeAppServer.start();
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      CRW_FLOW_HOST: fake.url,
      CODEX_HOME: join(root, "codex-home"),
    };
    delete env.CRW_FLOW_FAULT;
    const workflowPath = join(root, "crash.mjs");
    writeFileSync(workflowPath, workflowSource);
    return new CrashHarness(fake, root, env, workflowPath);
  }

  async stop(): Promise<void> {
    await this.fake.stop();
    rmSync(this.root, { recursive: true, force: true });
  }

  /** One run; a checkout shared with a rebuild of dist/ may fail a process's start: that run is made again. */
  async run(fault: string | null, options: CrashRunOptions = {}): Promise<CrashOutcome> {
    const out = await this.runOnce(fault, options);
    return out.log.includes("ERR_MODULE_NOT_FOUND") ? this.runOnce(fault, options) : out;
  }

  private async runOnce(fault: string | null, options: CrashRunOptions): Promise<CrashOutcome> {
    const { fake, root } = this;
    const runId = `crash-${this.seq++}`;
    const repo = gitRepo(join(root, `repo-${runId}`));
    const state = join(root, "state");
    const paths = runPaths(state, runId);
    // a fresh owner thread per run: the host's marker lookups list this run's subagents only
    const owner = fake.createOwnerThread({ cwd: root });
    fake.startOwnerTurn(owner);
    const runEnv = { ...this.env, CODEX_THREAD_ID: owner };
    const startEnv = fault ? { ...runEnv, CRW_FLOW_FAULT: fault } : runEnv;
    const kit = new ScriptedOwner({
      fake,
      owner,
      source: fileStepSource({ state, runId, replyWaitMs: 300 }),
      behave: options.behave ?? behave,
    });
    const args = ["start", this.workflowPath, "--run", runId, "--state", state, "--input", '{"base":1}'];
    const r = await crwFlow(
      [...args, "--poll-ms", "20", "--evidence", "--repo", repo, ...(options.startArgs ?? []), "--json"],
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
    let atKill: AtKill | null = null;
    try {
      await waitFor(`run ${runId} to end or its process to die`, () => !pidAlive(pid) || ended(), 30_000);
      if (!ended()) {
        killed = true;
        const rows = readJournalFile(paths.journal).rows;
        atKill = {
          last: rows.at(-1),
          record: existsSync(record),
          steps: listStepFiles(paths.steps).steps.map((s) => ({ call: s.call, k: s.k, marker: s.marker })),
          unanswered: unanswered(paths),
          packets: Object.fromEntries(
            rows.flatMap((x) => (x.type === "step_published" ? [[x.marker, existsSync(x.packet)]] : [])),
          ),
          host: hostView(fake, owner),
        };
        await options.whileDead?.({ fake, owner, paths, rows });
        const res = await crwFlow(["resume", runId, "--detach", "--state", state, "--json"], {
          ...runEnv,
          ...options.resumeEnv,
        });
        if (res.code !== 0) throw new Error(`resume failed: ${res.stderr}`);
        await waitFor(`resumed run ${runId} to end`, ended, 30_000).catch((e: Error) => {
          throw new Error(`${e.message}\n${runReport(paths)}`);
        });
      }
      // the process that ended the run lets its run lock go once it is done (after the release)
      await waitFor(`run ${runId}'s process to let the run go`, () => !existsSync(paths.runLock), 10_000);
    } finally {
      await kit.stop();
    }
    const rows = readJournalFile(paths.journal).rows;
    const second = rows.findIndex((x, i) => x.type === "started" && i > 0);
    const last = rows.at(-1);
    return {
      point: fault,
      owner,
      result: last?.type === "run_ended" ? last.result : undefined,
      rows,
      deadRows: second < 0 ? rows : rows.slice(0, second),
      resumedRows: second < 0 ? [] : rows.slice(second),
      killed,
      log: existsSync(paths.log) ? readFileSync(paths.log, "utf8") : "",
      leftSteps: listStepFiles(paths.steps).steps.length,
      atKill,
      record,
      branch: branchOf(repo, runId),
      host: hostView(fake, owner),
      replies: repliesOf(paths),
    };
  }
}

/** A call's completed tokens, by call. */
export function tokensByCall(rows: readonly JournalRow[]): Record<string, unknown> {
  return Object.fromEntries(rows.flatMap((r) => (r.type === "completed" ? [[r.call, r.tokens]] : [])));
}

/** Rows of one type (typed). */
export function rowsOf<T extends JournalRow["type"]>(
  rows: readonly JournalRow[],
  type: T,
): Array<Extract<JournalRow, { type: T }>> {
  return rows.filter((r): r is Extract<JournalRow, { type: T }> => r.type === type);
}
