import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  createAppServerHost,
  defineWorkflow,
  digestOf,
  executeRun,
  type FlowEvent,
  type FlowRunOutcome,
  type JournalRow,
  JournalWriter,
  listStepFiles,
  type RunPaths,
  type RunSpec,
  readJournalFile,
  readReply,
  reportName,
  runFlowCli,
  runPaths,
  SPEC_FORMAT,
  type StepFile,
  spawnMessage,
  type Workflow,
  writeReport,
  writeSpec,
} from "@crw/flow";
import { FakeAppServer } from "@crw/tools/codex";
import { expect, vi } from "vitest";

type SpawnInput = Parameters<FakeAppServer["spawnSubagent"]>[0];

import { type Behave, fileStepSource, ScriptedOwner } from "@crw/tools/flow";

/** A run of a workflow in this process against the fake app-server (real JSON-RPC over ws). */
export interface InProcessRun {
  fake: FakeAppServer;
  host: ReturnType<typeof createAppServerHost>;
  owner: string;
  paths: RunPaths;
  spec: RunSpec;
  root: string;
  rows(): JournalRow[];
  execute(
    workflow: Workflow,
    behave: Behave,
    opts?: { silent?: (s: { op: string }) => boolean },
  ): Promise<{
    outcome: FlowRunOutcome;
    ownerKit: ScriptedOwner;
    events: FlowEvent[];
  }>;
  /** Starts the run with no owner: the test plays the owner by hand. */
  /** Runs the workflow; `onEvent` sees each event as the run emits it (before the run goes on). */
  background(
    workflow: Workflow,
    onEvent?: (e: FlowEvent) => void,
  ): { done: Promise<FlowRunOutcome>; events: FlowEvent[] };
  /** Waits for the step files of the run (close files excluded). */
  steps(count?: number): Promise<StepFile[]>;
  /** Waits for the run's first step file. */
  firstStep(): Promise<StepFile>;
  /** The owner spawns a subagent of `agentRole` with the step's message (the fake host's spawn_agent). */
  spawn(
    step: { message: string },
    agentRole: string,
    extra?: Omit<SpawnInput, "ownerThreadId" | "message" | "agentRole">,
  ): { threadId: string; turnId: string };
  report(
    step: { call: string; k: number; attempt: number },
    agentId: string,
    runId?: string,
  ): Promise<string>;
  close(): Promise<void>;
}

export async function inProcessRun(
  options: {
    runId?: string;
    pollMs?: number;
    lostAfterMs?: number;
    input?: unknown;
    pool?: number;
    roles?: unknown;
  } = {},
): Promise<InProcessRun> {
  const root = mkdtempSync(join(tmpdir(), "crw-flow-test-"));
  const state = join(root, "state");
  const repo = join(root, "repo");
  mkdirSync(repo, { recursive: true });
  if (options.roles) {
    mkdirSync(join(repo, ".crw"), { recursive: true });
    writeFileSync(join(repo, ".crw", "flow-roles.json"), JSON.stringify({ roles: options.roles }));
  }
  const fake = await FakeAppServer.start();
  const owner = fake.createOwnerThread({ cwd: repo });
  fake.startOwnerTurn(owner);
  const runId = options.runId ?? "run-1";
  const paths = runPaths(state, runId);
  mkdirSync(paths.dir, { recursive: true });
  const spec: RunSpec = {
    format: SPEC_FORMAT,
    run_id: runId,
    workflow: join(root, "inline.mjs"),
    workflow_name: "inline",
    input: options.input ?? null,
    backend: "session",
    owner,
    pool: options.pool ?? 4,
    repo,
    host: fake.url,
    created_at: new Date().toISOString(),
    env: { TMPDIR: tmpdir() },
    poll_ms: options.pollMs ?? 20,
    lost_after_ms: options.lostAfterMs ?? 2_000,
  };
  writeSpec(paths.spec, spec);
  const host = createAppServerHost({ transport: fake.url });
  const run: InProcessRun = {
    fake,
    host,
    owner,
    paths,
    spec,
    root,
    rows: () => readJournalFile(paths.journal).rows,
    async execute(workflow, behave, opts = {}) {
      const events: FlowEvent[] = [];
      const ownerKit = new ScriptedOwner({
        fake,
        owner,
        source: fileStepSource({ state, runId }),
        behave,
        ...(opts.silent ? { silent: opts.silent } : {}),
      }).start();
      try {
        const outcome = await executeRun({
          paths,
          spec,
          host,
          processToken: null,
          workflow,
          onEvent: (e) => events.push(e),
        });
        await ownerKit.stop();
        await ownerKit.untilSettled(5_000); // the close steps written as the run ended
        return { outcome, ownerKit, events };
      } finally {
        await ownerKit.stop();
      }
    },
    background(workflow, onEvent) {
      const events: FlowEvent[] = [];
      const done = executeRun({
        paths,
        spec,
        host,
        processToken: null,
        workflow,
        onEvent: (e) => {
          events.push(e);
          onEvent?.(e);
        },
      });
      return { done, events };
    },
    async steps(count = 1) {
      const deadline = Date.now() + 10_000;
      for (;;) {
        const listed = listStepFiles(paths.steps).steps;
        if (listed.length >= count) return listed;
        if (Date.now() > deadline) throw new Error(`no ${count} step(s) in time`);
        await new Promise((r) => setTimeout(r, 10));
      }
    },
    async firstStep() {
      const [step] = await run.steps();
      if (!step) throw new Error("no step");
      return step;
    },
    spawn(step, agentRole, extra = {}) {
      return fake.spawnSubagent({ ownerThreadId: owner, message: step.message, agentRole, ...extra });
    },
    async report(step, agentId, otherRun) {
      const name = reportName(step.call, step.k, step.attempt, agentId);
      rmSync(join(paths.replies, name), { force: true });
      writeReport(paths.inbox, {
        format: "crw-flow-dispatch/1",
        run_id: otherRun ?? runId,
        call: step.call,
        k: step.k,
        attempt: step.attempt,
        agent_id: agentId,
        at: new Date().toISOString(),
      });
      const deadline = Date.now() + 10_000;
      for (;;) {
        const reply = readReply(paths.replies, name);
        if (reply) return reply.reply;
        if (Date.now() > deadline) return "queued";
        await new Promise((r) => setTimeout(r, 10));
      }
    },
    async close() {
      await host.close();
      await fake.stop();
      rmSync(root, { recursive: true, force: true });
    },
  };
  return run;
}

export const answerSchema = {
  type: "object",
  properties: { summary: { type: "string" }, score: { type: "integer" } },
  required: ["summary", "score"],
  additionalProperties: false,
} as const;

export function json(value: unknown): {
  kind: "answer";
  messages: Array<{ text: string; phase: "final_answer" }>;
  usage: { input: number; output: number };
} {
  return {
    kind: "answer",
    messages: [{ text: JSON.stringify(value), phase: "final_answer" }],
    usage: { input: 100, output: 20 },
  };
}

/** The answer schema of the one-call workflows: `{ n: integer }`. */
export const countSchema = { type: "object", required: ["n"], properties: { n: { type: "integer" } } };

/** Polls `check` every 10 ms until it holds; throws `timed out: <what>` after `ms`. */
export async function until(what: string, check: () => boolean, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** The journal rows of one type. */
export const rowsOfType = (rows: JournalRow[], type: string): JournalRow[] =>
  rows.filter((r) => r.type === type);

/** Role pairs of the default role table with no model or effort set (a `started` row's role_pairs). */
export const nullRolePairs = Object.fromEntries(
  ["architect", "executor", "executor-t1", "reviewer", "explorer", "critic"].map((r) => [
    r,
    { model: null, effort: null },
  ]),
);

/**
 * Journals what a run process writes before a session call's first step: the `started` row (no process,
 * the null role pairs) and the call's `prepared` row with its scratch workspace.
 */
export function appendStartedPrepared(
  w: JournalWriter,
  call: string,
  input: { role: "explorer"; task: string; schema: Record<string, unknown> | null; workspace: null },
  workspace: string,
): void {
  w.append([
    {
      type: "started",
      backend: "session",
      role_pairs: nullRolePairs,
      policy_digest: "sha256:x",
      process: null,
      pid: 1,
      process_n: 1,
    },
  ]);
  w.append([
    {
      type: "prepared",
      call,
      op: call,
      role: "explorer",
      input,
      input_digest: digestOf(input),
      backend: "session",
      allocation: { workspace, kind: "scratch" },
    },
  ]);
}

/**
 * Attempt 1 of the run's explorer call (task "count", `countSchema`) as a process that died left it: its
 * subagent spawned on the fake host with the step's message, and the journal with the run started, the
 * call prepared, the step published and its thread and turn bound, then the process's last row: `interrupt`,
 * an interrupt asked for (usage_limit) and not sent; `lost`, the attempt judged lost (its turn failed
 * without an error on an unloaded thread) before attempt 2's step was published.
 */
export function diedAfter(r: InProcessRun, last: "interrupt" | "lost"): { threadId: string; turnId: string } {
  const call = "explorer.1";
  const marker = `${call}/t1-a1`;
  const workspace = join(r.paths.workspaces, call);
  mkdirSync(workspace, { recursive: true });
  const packet = join(r.paths.steps, call, "packet-t1-a1.md");
  const a = r.spawn({ message: spawnMessage(marker, "explorer", workspace, packet) }, "explorer");
  const input = { role: "explorer" as const, task: "count", schema: countSchema, workspace: null };
  const w = JournalWriter.create(r.paths.journal, r.spec.run_id);
  appendStartedPrepared(w, call, input, workspace);
  const op = `${call}/t1`;
  w.append([
    {
      type: "step_published",
      call,
      op,
      k: 1,
      marker,
      attempt: 1,
      action: "spawn",
      input: "count",
      input_digest: "sha256:i",
      packet,
      packet_digest: "sha256:p",
      role: "explorer",
      agent_type: "explorer",
      model: null,
      effort: null,
      workspace,
      conversation_turn: 1,
    },
  ]);
  w.append([
    {
      type: "thread_started",
      call,
      thread_id: a.threadId,
      model: null,
      effort: null,
      cwd: workspace,
      host_cwd: null,
      parent_thread_id: r.owner,
      agent_role: "explorer",
      attempt: 1,
      via: "session",
      rollout_path: null,
      marker,
    },
    { type: "turn_started", call, op, k: 1, turn_id: a.turnId, attempt: 1, marker, conversation_turn: 1 },
  ]);
  w.append([
    last === "interrupt"
      ? { type: "interrupt_requested", call, op, reason: "usage_limit", k: 1, attempt: 1, turn_id: a.turnId }
      : {
          type: "session_attempt_lost",
          call,
          op,
          attempt: 1,
          agent_id: a.threadId,
          k: 1,
          turn_id: a.turnId,
          reason: "turn failed without an error",
          host_status: "notLoaded",
          turn_status: "failed",
        },
  ]);
  w.close();
  return a;
}

export { defineWorkflow };

/** What `crw flow show RUN --json` prints for a run (its stdout, parsed). */
export async function showRun(r: Pick<InProcessRun, "spec" | "paths">): Promise<{
  calls: Array<Record<string, unknown>>;
  [member: string]: unknown;
}> {
  const out: string[] = [];
  const spy = vi.spyOn(process.stdout, "write").mockImplementation((chunk) => {
    out.push(String(chunk));
    return true;
  });
  try {
    expect(await runFlowCli(["show", r.spec.run_id, "--state", r.paths.state, "--json"])).toBe(0);
  } finally {
    spy.mockRestore();
  }
  return JSON.parse(out.join(""));
}
