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
  functionOutputs,
  MockModel,
  type ModelReply,
  type ModelRequest,
  type OwnerModelState,
  ownerModel,
  type RealCodex,
  startRealCodex,
  subagentTurn,
  userTexts,
} from "@crw/tools/codex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { evidenceRecordPath, type JournalRow, readJournalFile, runPaths } from "../../src/index.js";
import { crwBin, ensureBuilt } from "../helpers/cli.js";

/**
 * Issue 4 with the real `codex app-server` as host, offline (the mock Responses model plays the owners and
 * the subagents). One app-server serves three owner threads at once, each its own scenario:
 * - two near-simultaneous `crw flow start` in one owner thread's shell: exactly one binds the thread;
 * - an owner that starts a run and ends its turn: the run's session_step_waiting wake, staged while the
 *   owner was busy, is delivered after that turn as a new turn on the real owner thread, and the owner
 *   then spawns the step and steps the run to its end;
 * - a continuation chain (resume: handle) through real subagents.
 */

type Row = JournalRow & Record<string, unknown>;

const schemaN = `{ type: "object", required: ["n"], properties: { n: { type: "integer" } } }`;

/** Scenario A: a run that makes no call and stays live a few seconds (its line stays open meanwhile). */
const lingerWorkflow = `
export default {
  name: "linger",
  async run() {
    await new Promise((resolve) => setTimeout(resolve, 5000));
    return { lingered: true };
  },
};
`;

/** Scenario B: one call. */
const wakeWorkflow = `
export default {
  name: "wake",
  async run(ctx) {
    return ctx.call({ role: "explorer", node: "woken", task: "Count the files", schema: ${schemaN} });
  },
};
`;

/** Scenario C: a call, a continuation of it, and a continuation of the continuation. */
const chainWorkflow = `
export default {
  name: "chain",
  async run(ctx) {
    const first = await ctx.call({ role: "explorer", node: "first", task: "Count the files", schema: ${schemaN} });
    const second = await ctx.call({ role: "explorer", node: "second", task: "Count them again", schema: ${schemaN}, resume: "first.1" });
    const third = await ctx.call({ role: "explorer", node: "third", task: "Count them once more", schema: ${schemaN}, resume: "second.1" });
    return [first.n, second.n, third.n];
  },
};
`;

const roles = { roles: { explorer: { model: "mock-explorer", effort: "low" } } };

let model: MockModel;
let codex: RealCodex;
let root: string;
let repo: string;
const subagentTexts = new Map<string, string>();
let evidenceSeen = "";

/** Subagents answer by their marker: the first call's task turn is prose (the repair runs). */
function subagentReply(request: ModelRequest): ModelReply {
  const { marker, text } = subagentTurn(request);
  if (marker) subagentTexts.set(marker, text);
  if (marker?.startsWith("build.1/")) {
    // before it ends its turn (where a stop hook runs) the executor reads its flow evidence record under
    // its own shell's cwd; the run places it when it binds the subagent, once the owner has reported it
    const outputs = functionOutputs(request);
    if (outputs.length === 0)
      return exec(
        "for i in $(seq 1 200); do ls .crw/flow-evidence/*.json >/dev/null 2>&1 && break; sleep 0.05; done; cat .crw/flow-evidence/*.json; echo; pwd",
        "look_for_evidence",
      );
    evidenceSeen = outputs[0]?.output ?? "";
  }
  const answer = (t: string): ModelReply => ({
    items: [{ type: "message", text: t, phase: "final_answer" }],
    usage: { input: 500, output: 20 },
  });
  if (marker?.startsWith("first.1/t1-")) return answer("I counted but I will not say in JSON.");
  if (marker?.startsWith("first.1/")) return answer('{"n":1}');
  if (marker?.startsWith("second.1/")) return answer('{"n":2}');
  if (marker?.startsWith("third.1/")) return answer('{"n":3}');
  return answer('{"n":7}');
}

const exec = (cmd: string, callId: string): ModelReply => ({
  items: [
    {
      type: "function_call",
      name: "exec_command",
      callId,
      arguments: { cmd, yield_time_ms: 30_000, max_output_tokens: 20_000 },
    },
  ],
});
const say = (text: string): ModelReply => ({ items: [{ type: "message", text, phase: "final_answer" }] });

async function ownerThread(): Promise<string> {
  const started = await codex.client.request<{ thread: { id: string } }>("thread/start", { cwd: repo });
  return started.thread.id;
}

async function startTurn(thread: string, text: string): Promise<string> {
  const turn = await codex.client.request<{ turn: { id: string } }>("turn/start", {
    threadId: thread,
    input: [{ type: "text", text, text_elements: [] }],
  });
  return turn.turn.id;
}

interface ReadThread {
  status: { type: string };
  turns: Array<{ id: string; status: string; items: Array<Record<string, unknown>> }>;
}

async function readOwner(thread: string): Promise<ReadThread> {
  const r = await codex.client.request<{ thread: ReadThread }>("thread/read", {
    threadId: thread,
    includeTurns: true,
  });
  return r.thread;
}

async function until<T>(what: string, check: () => Promise<T | undefined | null | false>, ms = 90_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check().catch(() => undefined); // e.g. a journal not written yet
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const rowsOf = (state: string, run: string): Row[] =>
  readJournalFile(runPaths(state, run).journal).rows as Row[];

const startCommand = (workflow: string, state: string) =>
  [
    process.execPath,
    crwBin,
    "flow start",
    workflow,
    `--state ${state}`,
    `--host ${codex.url}`,
    "--poll-ms 100",
    "--json",
  ].join(" ");

// ---- scenario A: two starts at once in one owner thread ----
interface PairOutcome {
  owner: string;
  state: string;
  answers: Array<Record<string, unknown>>;
}

async function twoStarts(): Promise<PairOutcome> {
  const state = join(root, "state-a");
  const wf = join(repo, "linger.mjs");
  writeFileSync(wf, lingerWorkflow);
  const owner = await ownerThread();
  const outs = [join(root, "start-1.json"), join(root, "start-2.json")];
  // both starts in one shell command of the owner (CODEX_THREAD_ID names the thread): near-simultaneous
  const cmd = outs.map((o) => `${startCommand(wf, state)} > ${o} 2>&1 &`).join(" ");
  model.on(
    (r) => r.threadId === owner,
    (r) => (functionOutputs(r).length === 0 ? exec(`${cmd} wait`, "two_starts") : say("both started")),
  );
  const turn = await startTurn(owner, "Start the linger workflow twice.");
  await codex.client.waitTurnCompleted(owner, turn, 60_000);
  const answers = outs.map((o) => JSON.parse(readFileSync(o, "utf8")) as Record<string, unknown>);
  // both runs end on their own (no call): wait until their processes let them go (a holder closes its
  // line after its run_ended row), so the lines are final
  for (const a of answers) {
    await until(`run ${a.run_id} to end`, async () =>
      rowsOf(state, String(a.run_id)).some((r) => r.type === "run_ended"),
    );
    await until(`run ${a.run_id}'s process to let it go`, async () => {
      return !existsSync(runPaths(state, String(a.run_id)).runLock);
    });
  }
  return { owner, state, answers };
}

// ---- scenario B: an idle owner woken by the run ----
interface WakeOutcome {
  owner: string;
  state: string;
  played: OwnerModelState;
  thread: ReadThread;
  firstTurn: string;
}

async function wokenOwner(): Promise<WakeOutcome> {
  const state = join(root, "state-b");
  const wf = join(repo, "wake.mjs");
  writeFileSync(wf, wakeWorkflow);
  const owner = await ownerThread();
  const played = ownerModel({ startCommand: startCommand(wf, state) });
  model.on(
    (r) => r.threadId === owner,
    (r) => {
      const last = functionOutputs(r).at(-1);
      const newTurn = userTexts(r).some((t) => t.includes("session_step_waiting"));
      if (!newTurn && last?.callId.startsWith("crw_start_")) {
        played.handler(r); // the played owner reads the start's answer (its run id and next command)
        // it stays busy until the run has published its step, then ends its turn without taking it
        const steps = join(runPaths(state, played.state.runId as string).steps, "woken.1");
        return exec(
          `for i in $(seq 1 300); do ls ${steps}/t1-a1.json >/dev/null 2>&1 && break; sleep 0.1; done; sleep 0.5`,
          "busy_until_published",
        );
      }
      if (!newTurn && last?.callId === "busy_until_published") return say("The run is started.");
      return played.handler(r);
    },
  );
  const firstTurn = await startTurn(owner, "Start the wake workflow with crw flow, then stop.");
  await codex.client.waitTurnCompleted(owner, firstTurn, 60_000);
  const run = () => played.state.runId as string;
  await until("the run to end", async () => rowsOf(state, run()).some((r) => r.type === "run_ended"));
  const thread = await until("the owner's woken turn to end", async () => {
    const t = await readOwner(owner);
    return t.turns.length >= 2 && t.status.type === "idle" && t.turns.at(-1)?.status === "completed"
      ? t
      : undefined;
  });
  return { owner, state, played: played.state, thread, firstTurn };
}

// ---- scenario C: a continuation chain ----
interface ChainOutcome {
  owner: string;
  state: string;
  played: OwnerModelState;
}

async function continuationChain(): Promise<ChainOutcome> {
  const state = join(root, "state-c");
  const wf = join(repo, "chain.mjs");
  writeFileSync(wf, chainWorkflow);
  const owner = await ownerThread();
  const played = ownerModel({ startCommand: startCommand(wf, state) });
  model.on((r) => r.threadId === owner, played.handler);
  const turn = await startTurn(owner, "Run the chain workflow with crw flow.");
  await codex.client.waitTurnCompleted(owner, turn, 150_000);
  return { owner, state, played: played.state };
}

// ---- scenario D: a gated executor in a run with an evidence cwd ----
const buildWorkflow = `
export default {
  name: "build",
  async run(ctx) {
    return ctx.call({ role: "executor", node: "build", task: "Build it", schema: ${schemaN} });
  },
};
`;

async function evidenceRun(): Promise<ChainOutcome> {
  const state = join(root, "state-d");
  const wf = join(repo, "build.mjs");
  writeFileSync(wf, buildWorkflow);
  const owner = await ownerThread();
  const played = ownerModel({ startCommand: `${startCommand(wf, state)} --evidence` });
  model.on((r) => r.threadId === owner, played.handler);
  const turn = await startTurn(owner, "Run the build workflow with crw flow.");
  await codex.client.waitTurnCompleted(owner, turn, 150_000);
  if (played.state.failure) throw new Error(`the owner gave up: ${played.state.failure}`);
  const run = played.state.runId as string;
  await until("the run's process to let it go", async () => !existsSync(runPaths(state, run).runLock)).catch(
    (e: Error) => {
      throw new Error(`${e.message}\n${runDiagnosis(state, run)}`);
    },
  );
  return { owner, state, played: played.state };
}

/** Where a run stands, for a failure's message: its journal's last rows and its process's log. */
function runDiagnosis(state: string, run: string): string {
  const paths = runPaths(state, run);
  const rows = existsSync(paths.journal) ? rowsOf(state, run).slice(-8) : [];
  const log = existsSync(paths.log) ? readFileSync(paths.log, "utf8").slice(-3000) : "(no process.log)";
  return `last rows: ${rows.map((r) => `${r.type}${"call" in r ? ` ${r.call}` : ""}`).join(", ")}\nprocess.log:\n${log}`;
}

let pair: PairOutcome;
let woken: WakeOutcome;
let chain: ChainOutcome;
let evidence: ChainOutcome;

beforeAll(async () => {
  ensureBuilt();
  root = mkdtempSync(join(tmpdir(), "crw-e2e-rest-"));
  repo = join(root, "repo");
  mkdirSync(join(repo, ".crw"), { recursive: true });
  writeFileSync(join(repo, ".crw", "flow-roles.json"), JSON.stringify(roles));
  model = await MockModel.start();
  model.on((r) => r.parentThreadId !== null, subagentReply);
  codex = await startRealCodex({
    home: join(root, "codex-home"),
    cwd: repo,
    baseUrl: model.baseUrl,
    models: ["mock-explorer"],
    listen: "ws",
    // the executor role spawns as agent type executor: a Codex role of its own
    extraToml: '\n[agents.executor]\ndescription = "crw flow executor"\n',
  });
  [pair, woken, chain, evidence] = await Promise.all([
    twoStarts(),
    wokenOwner(),
    continuationChain(),
    evidenceRun(),
  ]);
}, 200_000);

afterAll(async () => {
  await codex?.stop();
  await model?.stop();
  if (!process.env.CRW_KEEP_E2E && root) rmSync(root, { recursive: true, force: true });
});

describe("two near-simultaneous starts on one real codex owner thread", () => {
  it("exactly one binds the thread; the other warns (owner_bound) and does not bind, and neither does its process (S000-271)", () => {
    const bound = pair.answers.map((a) => {
      const facts = a.facts as Array<{ fact: string; ok: boolean; detail: string }>;
      return facts.find((f) => f.fact === "owner_bound");
    });
    // both started, both on this owner thread
    for (const a of pair.answers) expect(a).toMatchObject({ backend: "session", owner: pair.owner });
    expect(bound.filter((f) => f?.ok)).toHaveLength(1);
    const refused = bound.find((f) => !f?.ok);
    expect(refused?.detail).toMatch(/live run|another run|is not bound/);
    const winner = pair.answers[bound.findIndex((f) => f?.ok)]?.run_id;
    const loser = pair.answers[bound.findIndex((f) => !f?.ok)]?.run_id;
    const file = join(pair.state, "flow-bound", `${pair.owner}.jsonl`);
    const lines = readFileSync(file, "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { kind: string; run_id: string });
    // the winner's line (its start's, maybe its process's again) and its close when it ended; the
    // loser's run never wrote one, not even from its process after its started row
    expect(lines.every((l) => l.run_id === winner)).toBe(true);
    expect(lines.some((l) => l.kind === "orchestrator")).toBe(true);
    expect(lines.at(-1)).toMatchObject({ kind: "closed", run_id: winner });
    const loserLog = readFileSync(join(pair.state, "flow", String(loser), "process.log"), "utf8");
    expect(loserLog).toMatch(/owner binding: /);
    // both runs ran to their end
    for (const a of pair.answers) {
      expect(rowsOf(pair.state, String(a.run_id)).find((r) => r.type === "run_ended")).toMatchObject({
        status: "completed",
      });
    }
  });
});

describe("an owner woken by the run on the real codex", () => {
  it("the wake staged while the owner was busy is delivered after its turn, as a new turn on the owner thread; the owner then spawns the step (S000-291)", () => {
    expect(woken.played.failure).toBeNull();
    const run = woken.played.runId as string;
    const rows = rowsOf(woken.state, run);
    const wakes = rows.filter((r) => r.type === "session_wake");
    expect(wakes[0]).toMatchObject({
      owner: woken.owner,
      owner_status: "active",
      staged: true,
      delivery: "after_turn",
      ops: ["woken.1/t1"],
    });
    const delivered = rows.filter((r) => r.type === "message_delivery" && r.delivered);
    expect(delivered).toHaveLength(1);
    const [firstTurn, wokenTurn] = woken.thread.turns;
    expect(firstTurn?.id).toBe(woken.firstTurn);
    expect(delivered[0]).toMatchObject({ wake_id: wakes[0]?.wake_id, turn_id: wokenTurn?.id });
    // the delivery came after the owner's first turn had ended: it started the second turn
    const wakeText = JSON.stringify(wokenTurn?.items.find((i) => i.type === "userMessage"));
    expect(wakeText).toContain("session_step_waiting");
    expect(wakeText).toContain(`crw flow next ${run}`);
    // the first turn took no step; the woken turn spawned it
    const spawns = (t: ReadThread["turns"][number] | undefined) =>
      (t?.items ?? []).filter((i) => i.type === "collabAgentToolCall" && i.tool === "spawnAgent");
    expect(spawns(firstTurn)).toHaveLength(0);
    expect(spawns(wokenTurn)).toHaveLength(1);
    const thread = rows.find((r) => r.type === "thread_started");
    expect(thread).toMatchObject({ call: "woken.1", parent_thread_id: woken.owner, via: "session" });
    expect(rows.find((r) => r.type === "run_ended")).toMatchObject({ status: "completed", result: { n: 7 } });
  });
});

describe("a continuation chain through real codex subagents", () => {
  let rows: Row[];
  const of = (type: string, call?: string) =>
    rows.filter((r) => r.type === type && (call === undefined || r.call === call));

  it("the owner stepped the chain to its end", () => {
    expect(chain.played.failure).toBeNull();
    rows = rowsOf(chain.state, chain.played.runId as string);
    expect(of("run_ended")).toMatchObject([{ status: "completed", result: [1, 2, 3] }]);
  });

  it("each continuation runs on a new subagent of the owner with its own thread_started; its input keeps the handle's thread chain (S000-155 S000-157 S000-051)", () => {
    const threads = of("thread_started");
    expect(threads.map((t) => t.call)).toEqual(["first.1", "second.1", "third.1"]);
    const ids = threads.map((t) => t.thread_id as string);
    expect(new Set(ids).size).toBe(3);
    for (const t of threads) expect(t).toMatchObject({ parent_thread_id: chain.owner, via: "session" });
    const resumeOf = (call: string) =>
      (of("prepared", call)[0] as { input: { resume?: unknown } } | undefined)?.input.resume;
    expect(resumeOf("second.1")).toEqual({ call: "first.1", chain: [ids[0]] });
    expect(resumeOf("third.1")).toEqual({ call: "second.1", chain: [ids[0], ids[1]] });
    // every continuation is a spawn (a new subagent), never a send_input to the handle's
    expect(of("step_published", "second.1").map((s) => s.action)).toEqual(["spawn"]);
    expect(of("step_published", "third.1").map((s) => s.action)).toEqual(["spawn"]);
  });

  it("for a session subagent the record holds the continued calls' turns before its own, then the call's conversation (the repair included) (S000-158)", () => {
    const step = of("step_published", "third.1")[0] as { packet: string; marker: string };
    // the real subagent got the spawn message naming that packet
    expect(subagentTexts.get(step.marker)).toContain(step.packet);
    const packet = readFileSync(step.packet, "utf8");
    expect(packet).toContain("## Continued call second.1");
    const at = (s: string) => packet.indexOf(s);
    const places = [
      "Call first.1, conversation turn 1 (first.1/t1-a1)",
      "Call first.1, conversation turn 2 (first.1/t2-a1)",
      "Call second.1, conversation turn 1 (second.1/t1-a1)",
    ].map(at);
    expect(places.every((p) => p > 0)).toBe(true);
    expect([...places].sort((a, b) => a - b)).toEqual(places);
    // the inputs the turns took: the first task, its repair, the second task
    expect(packet).toContain("Count the files");
    expect(packet).toContain("Count them again");
    const answerFile = /Its answer: (\S+)/.exec(packet)?.[1] ?? "";
    expect(existsSync(answerFile)).toBe(true);
    expect(JSON.parse(readFileSync(answerFile, "utf8"))).toEqual({ n: 2 });
    // the first call's repair ran on its open subagent (send_input): one thread for its two turns
    expect(of("turn_started", "first.1").map((t) => t.conversation_turn)).toEqual([1, 2]);
    expect(of("thread_started", "first.1")).toHaveLength(1);
    expect(readdirSync(join(runPaths(chain.state, chain.played.runId as string).steps))).toContain("third.1");
  });
});

describe("a flow evidence record on the real codex", () => {
  it("the executor's spawn step names its record; the bind places it under the cwd the host reports for the subagent, where its shell finds it; the run's end releases it (S000-023 S000-076 S000-081)", () => {
    expect(evidence.played.failure).toBeNull();
    const run = evidence.played.runId as string;
    const rows = rowsOf(evidence.state, run);
    expect(rows.find((r) => r.type === "run_ended")).toMatchObject({ status: "completed", result: { n: 7 } });
    const assignment = `flow:${run}/build.1/g1`;
    expect(rows.find((r) => r.type === "step_published")).toMatchObject({
      evidence_assignment: assignment,
      evidence_cwds: [],
    });
    const placed = rows.filter((r) => r.type === "evidence_placed");
    const thread = rows.find((r) => r.type === "thread_started");
    // the real host reports the owner's cwd for its subagent: the record goes there
    expect(placed).toEqual([expect.objectContaining({ evidence_cwd: repo, marker: "build.1/t1-a1" })]);
    expect(thread).toMatchObject({ host_cwd: repo, evidence_cwd: repo, parent_thread_id: evidence.owner });
    expect((placed[0]?.seq as number) < (thread?.seq as number)).toBe(true);
    // the subagent's own shell (the cwd its stop hook runs in) read the record while it worked
    expect(evidenceSeen).toContain(`"evidence_assignment":"${assignment}"`);
    expect(evidenceSeen).toContain(repo);
    expect(existsSync(evidenceRecordPath(repo, assignment))).toBe(false);
  });
});
