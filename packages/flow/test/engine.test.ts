import { createHash } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  digestOf,
  FileStepBus,
  type JournalRow,
  JournalWriter,
  listStepFiles,
  readJournalFile,
  readRoleTable,
  resolveTable,
} from "@crw/flow";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import {
  answerSchema,
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  json,
  until,
} from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const pair = defineWorkflow({
  name: "pair",
  async run(ctx) {
    const [a, b] = await Promise.all([
      ctx.call({ role: "explorer", task: "find A", schema: answerSchema }),
      ctx.call({ role: "reviewer", task: "judge B", schema: answerSchema }),
    ]);
    const c = await ctx.call<{ summary: string; score: number }>({
      role: "architect",
      task: "combine",
      schema: answerSchema,
    });
    return { a, b, c };
  },
});

describe("a session run in process against the fake app-server", () => {
  it("every call runs on a subagent the owner thread spawned for its role; the engine starts no thread or turn (S000-001 S000-002 S000-003)", async () => {
    run = await inProcessRun();
    const { outcome, events } = await run.execute(pair, (step) =>
      json({ summary: `answer to ${step.call}`, score: step.k }),
    );
    // each turn's subagent was bound from the owner's report, not found on the host later
    expect(
      events
        .flatMap((e) => (e.type === "bound" ? [[e.call, e.via]] : []))
        .sort((a, b) => String(a[0]).localeCompare(String(b[0]))),
    ).toEqual([
      ["architect.1", "report"],
      ["explorer.1", "report"],
      ["reviewer.1", "report"],
    ]);
    expect(outcome).toEqual({
      state: "completed",
      result: {
        a: { summary: "answer to explorer.1", score: 1 },
        b: { summary: "answer to reviewer.1", score: 1 },
        c: { summary: "answer to architect.1", score: 1 },
      },
    });
    const methods = new Set(run.fake.requests.map((r) => r.method));
    expect(methods.has("thread/start")).toBe(false);
    expect(methods.has("turn/start")).toBe(false);
    const rows = run.rows();
    // each call's turns ran on a subagent the owner thread spawned for the call's role
    const threads = rows.flatMap((r) => (r.type === "thread_started" ? [r] : []));
    expect(threads.map((t) => t.call).sort()).toEqual(["architect.1", "explorer.1", "reviewer.1"]);
    for (const t of threads) {
      expect(t).toMatchObject({ via: "session", parent_thread_id: run.owner });
      const host = run.fake.state.get(t.thread_id).thread;
      expect(host.parentThreadId).toBe(run.owner);
      expect(host.agentRole).toBe(t.call.split(".")[0]);
    }
    const types = rows.map((r) => r.type);
    expect(types[0]).toBe("started");
    expect(types.filter((t) => t === "completed")).toHaveLength(3);
    expect(types.at(-1)).toBe("run_ended");
  });

  describe("a turn of commentary, an earlier final answer and a last one with prose before its JSON, no output tokens", () => {
    let own: InProcessRun;
    let outcome: unknown;
    let completed: ReturnType<InProcessRun["rows"]>[number] | undefined;
    beforeAll(async () => {
      own = await inProcessRun();
      const one = defineWorkflow({
        name: "one",
        run: (ctx) => ctx.call({ role: "explorer", task: "t", schema: answerSchema }),
      });
      ({ outcome } = await own.execute(one, () => ({
        kind: "answer",
        messages: [
          { text: '{"summary":"draft","score":0}', phase: "commentary" },
          { text: '{"summary":"early","score":1}', phase: "final_answer" },
          { text: 'Here is my answer:\n{"summary":"done","score":3}', phase: "final_answer" },
        ],
        usage: { input: 10, output: 0 },
      })));
      completed = own.rows().find((r) => r.type === "completed");
    });
    afterAll(async () => {
      await own?.close();
    });

    it("the answer is the turn's last final_answer message (S000-084)", () => {
      expect(outcome).toEqual({ state: "completed", result: { summary: "done", score: 3 } });
    });

    it("commentary is never the answer (S000-086)", () => {
      expect(completed).not.toMatchObject({ result: { summary: "draft" } });
      expect(completed).toMatchObject({ result: { summary: "done" } });
    });

    it("prose before the JSON: the object is extracted, the row keeps it, its digest and the whole message (S000-087)", () => {
      expect(completed).toMatchObject({
        result: { summary: "done", score: 3 },
        result_digest: digestOf({ summary: "done", score: 3 }),
        raw_text: 'Here is my answer:\n{"summary":"done","score":3}',
        extracted: true,
      });
    });

    it("a token part that is 0 is left out of the row, not written as 0 (S000-095)", () => {
      expect(completed).toMatchObject({ tokens: { input: 10, total: 10 } });
      if (completed?.type === "completed") expect(completed.tokens).not.toHaveProperty("output");
    });
  });

  it("a second invalid answer ends the call null_model; the workflow sees a FlowCallError", async () => {
    run = await inProcessRun();
    const one = defineWorkflow({
      name: "one",
      async run(ctx) {
        try {
          await ctx.call({ role: "explorer", task: "t", schema: answerSchema });
          return "no error";
        } catch (e) {
          return (e as Error).name;
        }
      },
    });
    const { outcome } = await run.execute(one, () => json({ wrong: true }));
    expect(outcome).toEqual({ state: "completed", result: "FlowCallError" });
    const rows = run.rows();
    expect(rows.filter((r) => r.type === "step_published")).toHaveLength(2);
    const nm = rows.find((r) => r.type === "null_model");
    expect(nm).toMatchObject({ reason: "answer_invalid_after_repair" });
  });

  it("the subagent is closed once the call has its terminal row, by a close step naming that subagent (S000-125 S000-028)", async () => {
    run = await inProcessRun();
    const r = run;
    // what the journal held when each close step was written
    const terminalAtClose: Array<[string, boolean]> = [];
    const writeClose = FileStepBus.prototype.writeClose;
    const spy = vi.spyOn(FileStepBus.prototype, "writeClose").mockImplementation(function (
      this: FileStepBus,
      close,
    ) {
      const rows = readJournalFile(r.paths.journal).rows;
      const terminal = rows.some(
        (x) => (x.type === "completed" || x.type === "null_model") && x.call === close.call,
      );
      terminalAtClose.push([close.call, terminal]);
      writeClose.call(this, close);
    });
    const { ownerKit } = await run
      .execute(pair, () => json({ summary: "x", score: 1 }))
      .finally(() => spy.mockRestore());
    expect(terminalAtClose.sort()).toEqual([
      ["architect.1", true],
      ["explorer.1", true],
      ["reviewer.1", true],
    ]);
    const closes = ownerKit.taken.filter((s) => s.action === "close");
    expect(closes.map((c) => c.call).sort()).toEqual(["architect.1", "explorer.1", "reviewer.1"]);
    for (const c of closes)
      expect(run.fake.state.get(c.agent_id as string).thread.status.type).toBe("notLoaded");
    // each close names the call's own subagent and attempt
    const threads = run.rows().flatMap((r) => (r.type === "thread_started" ? [r] : []));
    for (const c of closes)
      expect(threads).toContainEqual(
        expect.objectContaining({ call: c.call, attempt: c.attempt, thread_id: c.agent_id }),
      );
  });

  it("two closes of one attempt are two files steps/<call>/close-a<n>-<agent>.json, neither overwriting the other (S000-028)", () => {
    const steps = mkdtempSync(join(tmpdir(), "crw-flow-closes-"));
    const bus = new FileStepBus(steps);
    for (const agent of ["agent-a", "agent-b"])
      bus.writeClose({ run_id: "r", call: "explorer.1", attempt: 1, action: "close", agent_id: agent });
    const closes = listStepFiles(steps).closes;
    expect(closes.map((c) => [c.attempt, c.agent_id])).toEqual([
      [1, "agent-a"],
      [1, "agent-b"],
    ]);
    expect(readdirSync(join(steps, "explorer.1")).sort()).toEqual([
      "close-a1-agent-a.json",
      "close-a1-agent-b.json",
    ]);
    rmSync(steps, { recursive: true, force: true });
  });

  it("a spawn the owner never reports is bound by its marker on the host (S000-074)", async () => {
    run = await inProcessRun();
    const one = defineWorkflow({
      name: "one",
      run: (ctx) => ctx.call({ role: "explorer", task: "t", schema: answerSchema }),
    });
    const { outcome, events } = await run.execute(one, () => json({ summary: "quiet", score: 1 }), {
      silent: () => true,
    });
    expect(outcome.state).toBe("completed");
    expect(events.some((e) => e.type === "bound" && e.via === "lookup")).toBe(true);
  });

  it("a repair the owner sends and never reports is bound by its marker turn on the subagent (S000-074)", async () => {
    run = await inProcessRun();
    const r = run;
    const one = defineWorkflow({
      name: "one",
      run: (ctx) => ctx.call({ role: "explorer", task: "t", schema: answerSchema }),
    });
    const { done, events } = r.background(one);
    // the owner spawns for the step and sends the repair, and reports neither
    const s1 = await r.firstStep();
    const a = r.spawn(s1, "explorer");
    r.fake.answer(a.threadId, JSON.stringify({ wrong: true }));
    await until("the repair's step", () => ofType(r.rows(), "step_published").length === 2);
    const s2 = (await r.steps()).find((x) => x.k === 2);
    if (!s2) throw new Error("no repair step file");
    r.fake.sendInput(a.threadId, s2.message);
    await until("the repair's bind", () => ofType(r.rows(), "turn_started").length === 2, 5_000);
    r.fake.answer(a.threadId, JSON.stringify({ summary: "fixed", score: 2 }));
    expect(await done).toEqual({ state: "completed", result: { summary: "fixed", score: 2 } });
    expect(events.flatMap((e) => (e.type === "bound" ? [[e.marker, e.via]] : []))).toEqual([
      ["explorer.1/t1-a1", "lookup"],
      ["explorer.1/t2-a1", "lookup"],
    ]);
  });

  it("a zod schema is accepted and converted to JSON Schema; the packet carries it", async () => {
    const { z } = await import("zod");
    run = await inProcessRun();
    const wf = defineWorkflow({
      name: "zod",
      run: (ctx) =>
        ctx.call({ role: "explorer", task: "t", schema: z.object({ answer: z.string().min(2) }) }),
    });
    const { outcome } = await run.execute(wf, (step) =>
      step.k === 1 ? json({ answer: "x" }) : json({ answer: "ok" }),
    );
    expect(outcome).toEqual({ state: "completed", result: { answer: "ok" } });
    const prepared = run.rows().find((r) => r.type === "prepared");
    expect(prepared).toMatchObject({ input: { schema: { type: "object", required: ["answer"] } } });
  });

  it("an exceeded context window is a null_model (S000-091)", async () => {
    run = await inProcessRun();
    const one = defineWorkflow({
      name: "one",
      run: (ctx) => ctx.call({ role: "explorer", task: "t" }).catch((e: Error) => e.message),
    });
    const { outcome } = await run.execute(one, () => ({
      kind: "fail",
      codexErrorInfo: "contextWindowExceeded",
    }));
    expect(outcome.state).toBe("completed");
    expect(run.rows().find((r) => r.type === "null_model")).toMatchObject({
      reason: "context_window_exceeded",
    });
  });
});

const sha256 = (text: string) => `sha256:${createHash("sha256").update(text).digest("hex")}`;

type RowOf<T extends JournalRow["type"]> = Extract<JournalRow, { type: T }>;
const ofType = <T extends JournalRow["type"]>(rows: JournalRow[], type: T, call?: string): RowOf<T>[] =>
  rows.filter(
    (r): r is RowOf<T> => r.type === type && (call === undefined || ("call" in r && r.call === call)),
  );

describe("the rows of a session run whose role store pins the explorer's pair", () => {
  let pinned: InProcessRun;
  let rows: JournalRow[];
  beforeAll(async () => {
    pinned = await inProcessRun({ roles: { explorer: { model: "m-explore", effort: "high" } } });
    await pinned.execute(pair, () => json({ summary: "x", score: 1 }));
    rows = pinned.rows();
  });
  afterAll(() => pinned?.close());

  it("the started row records the session backend (S000-005)", () => {
    expect(ofType(rows, "started")[0]?.backend).toBe("session");
  });

  it("the started row pins a pair for every role, the store's where it sets one, and the steps run on it (S000-300)", () => {
    const started = ofType(rows, "started")[0];
    expect(Object.keys(started?.role_pairs ?? {}).sort()).toEqual(
      ["architect", "critic", "executor", "executor-t1", "explorer", "reviewer"].sort(),
    );
    expect(started?.role_pairs.explorer).toEqual({ model: "m-explore", effort: "high" });
    expect(started?.role_pairs.reviewer).toEqual({ model: null, effort: null });
    for (const step of ofType(rows, "step_published"))
      expect({ model: step.model, effort: step.effort }).toEqual(started?.role_pairs[step.role]);
  });

  it("the holder's started row records the policy digest of the table it runs on (S000-210)", () => {
    const started = ofType(rows, "started")[0];
    const table = readRoleTable(pinned.spec.repo);
    expect(table.roles.explorer).toMatchObject({ model: "m-explore", effort: "high" });
    expect(started?.policy_digest).toBe(table.policy_digest);
    // the store's table, not the built-in one
    expect(started?.policy_digest).not.toBe(resolveTable(undefined, null).policy_digest);
    // in process there is no process lock to name; the CLI's run names its own (crash suite)
    expect(started).toMatchObject({ process: null, process_n: 1 });
  });

  it("each prepared row records the session backend and the one allocation every step of the call uses (S000-166)", () => {
    const prepared = ofType(rows, "prepared");
    expect(prepared).toHaveLength(3);
    for (const p of prepared) {
      expect(p.backend).toBe("session");
      expect(p.allocation.workspace).toBe(`${pinned.paths.workspaces}/${p.call}`);
      for (const step of ofType(rows, "step_published", p.call))
        expect(step.workspace).toBe(p.allocation.workspace);
    }
  });
});

describe("a spawned step and its bind", () => {
  let r: InProcessRun;
  let rows: JournalRow[];
  /** The row types of each batch the journal wrote, in order. */
  const batches: string[][] = [];
  beforeAll(async () => {
    r = await inProcessRun();
    const append = JournalWriter.prototype.append;
    const appendDurable = JournalWriter.prototype.appendDurable;
    const spies = [
      vi.spyOn(JournalWriter.prototype, "append").mockImplementation(function (this: JournalWriter, batch) {
        batches.push(batch.map((x) => x.type));
        return append.call(this, batch);
      }),
      vi.spyOn(JournalWriter.prototype, "appendDurable").mockImplementation(function (
        this: JournalWriter,
        batch,
      ) {
        batches.push(batch.map((x) => x.type));
        return appendDurable.call(this, batch);
      }),
    ];
    await r
      .execute(pair, () => json({ summary: "x", score: 1 }))
      .finally(() => {
        for (const s of spies) s.mockRestore();
      });
    rows = r.rows();
  });
  afterAll(() => r?.close());
  const step = () => ofType(rows, "step_published", "explorer.1")[0] as RowOf<"step_published">;

  it("a step's row carries k, op, marker, attempt, action, its input and the input's digest (S000-015)", () => {
    expect(step()).toMatchObject({
      k: 1,
      op: "explorer.1/t1",
      marker: "explorer.1/t1-a1",
      attempt: 1,
      action: "spawn",
      input: "find A",
    });
    expect(step().input_digest).toBe(sha256("find A"));
  });

  it("a step's row carries its packet and the packet's digest, role, agent type, pair and workspace (S000-016)", () => {
    expect(step()).toMatchObject({
      role: "explorer",
      agent_type: "explorer",
      model: null,
      effort: null,
      workspace: `${r.paths.workspaces}/explorer.1`,
      packet: `${r.paths.steps}/explorer.1/packet-t1-a1.md`,
    });
    expect(step().packet_digest).toBe(sha256(readFileSync(step().packet, "utf8")));
  });

  it("a bind writes thread_started with the host's thread and pair, cwd P, host_cwd, parent, role, attempt, rollout and marker (S000-075)", () => {
    const ts = ofType(rows, "thread_started", "explorer.1")[0];
    const host = r.fake.state.threads.get(ts?.thread_id ?? "")?.thread;
    expect(host?.parentThreadId).toBe(r.owner);
    expect(ts).toMatchObject({
      model: host?.model,
      effort: host?.reasoningEffort,
      cwd: `${r.paths.workspaces}/explorer.1`,
      host_cwd: `${r.root}/repo`,
      parent_thread_id: r.owner,
      agent_role: "explorer",
      via: "session",
      rollout_path: host?.path,
      marker: "explorer.1/t1-a1",
      attempt: 1,
    });
  });

  it("a bind writes turn_started with k, op, the host's turn, attempt, marker and conversation turn, in the batch of thread_started (S000-078)", () => {
    const ts = ofType(rows, "thread_started", "explorer.1")[0] as RowOf<"thread_started">;
    const tu = ofType(rows, "turn_started", "explorer.1")[0] as RowOf<"turn_started">;
    const hostTurn = r.fake.state.threads.get(ts.thread_id)?.turns[0];
    expect(tu).toMatchObject({
      k: 1,
      op: "explorer.1/t1",
      turn_id: hostTurn?.id,
      attempt: 1,
      marker: "explorer.1/t1-a1",
      conversation_turn: 1,
    });
    expect(tu).not.toHaveProperty("replaces_turn");
    // one batch: the next seq, the same write time, written by one append
    expect([tu.seq, tu.at]).toEqual([ts.seq + 1, ts.at]);
    const binds = batches.filter((b) => b.includes("thread_started"));
    expect(binds).toEqual([
      ["thread_started", "turn_started"],
      ["thread_started", "turn_started"],
      ["thread_started", "turn_started"],
    ]);
  });

  it("the cwd the host reports for a subagent (its parent's) is only host_cwd: the call's cwd and the subagent's workspace are P (S000-014)", () => {
    const ts = ofType(rows, "thread_started", "explorer.1")[0] as RowOf<"thread_started">;
    const host = r.fake.state.threads.get(ts.thread_id)?.thread;
    expect(ts.host_cwd).toBe(host?.cwd);
    expect(ts.cwd).not.toBe(host?.cwd);
    expect(ts.cwd).toBe(step().workspace);
    // the spawn message sends the subagent to P, never to the host's cwd
    expect(host?.preview).toContain(`Your workspace is ${step().workspace}`);
    expect(host?.preview).not.toContain(`workdir ${host?.cwd}`);
  });
});

describe("an invalid answer gets one repair on the open subagent", () => {
  let r: InProcessRun;
  let rows: JournalRow[];
  let outcome: unknown;
  const one = defineWorkflow({
    name: "one",
    run: (ctx) => ctx.call({ role: "explorer", task: "count things", schema: answerSchema }),
  });
  beforeAll(async () => {
    r = await inProcessRun();
    ({ outcome } = await r.execute(one, (step) =>
      step.k === 1
        ? {
            kind: "answer",
            messages: [{ text: "not json at all", phase: "final_answer" }],
            usage: { input: 100, output: 10, cached_input: 40, reasoning_output: 7, total: 117 },
          }
        : {
            kind: "answer",
            messages: [{ text: '{"summary":"fixed","score":2}', phase: "final_answer" }],
            usage: { input: 50, output: 5, reasoning_output: 3, total: 58 },
          },
    ));
    rows = r.rows();
  });
  afterAll(() => r?.close());
  const repair = () => ofType(rows, "step_published")[1] as RowOf<"step_published">;
  const first = () => ofType(rows, "thread_started")[0] as RowOf<"thread_started">;

  it("the repair is a send_input step on the subagent still open, which gets its second turn there (S000-027)", () => {
    expect(outcome).toEqual({ state: "completed", result: { summary: "fixed", score: 2 } });
    expect(repair()).toMatchObject({ k: 2, attempt: 1, action: "send_input", marker: "explorer.1/t2-a1" });
    expect(
      [...r.fake.state.threads.values()].filter((t) => t.thread.parentThreadId === r.owner),
    ).toHaveLength(1);
    expect(r.fake.state.threads.get(first().thread_id)?.turns).toHaveLength(2);
  });

  it("the repair's step row names the subagent it is sent to (S000-017)", () => {
    expect(repair().agent_id).toBe(first().thread_id);
  });

  it("the repair's step row carries the answer it repairs and why it failed (S000-019)", () => {
    expect(repair()).toMatchObject({
      previous_answer: "not json at all",
      repair: { answer: "not json at all" },
    });
    expect(repair().repair?.errors.length).toBeGreaterThan(0);
  });

  it("the repair's step row carries what the turns before it counted, as tokens_seen and call_tokens (S000-020)", () => {
    const before = { input: 100, cached_input: 40, output: 10, reasoning_output: 7, total: 117 };
    expect(repair()).toMatchObject({ tokens_seen: before, call_tokens: before });
  });

  it("a send_input turn's bind writes turn_started only (S000-079)", () => {
    const after = rows.slice(rows.indexOf(repair()) + 1).filter((x) => "call" in x);
    expect(after.map((x) => x.type)).toEqual(["turn_started", "completed"]);
  });

  it("the call's tokens are the rollout's last count, part by part, its two turns each counted once (S000-093 S000-094)", () => {
    const completed = ofType(rows, "completed")[0];
    const usage = r.fake.state.threads.get(first().thread_id)?.usage;
    expect(completed?.tokens).toEqual({
      input: usage?.inputTokens,
      cached_input: usage?.cachedInputTokens,
      output: usage?.outputTokens,
      reasoning_output: usage?.reasoningOutputTokens,
      total: usage?.totalTokens,
    });
    expect(completed?.tokens).toEqual({
      input: 150,
      cached_input: 40,
      output: 15,
      reasoning_output: 10,
      total: 175,
    });
  });
});

describe("an answer extracted from prose", () => {
  it("goes through the schema like any answer: an extracted object that fails it gets the one repair (S000-088)", async () => {
    run = await inProcessRun();
    const one = defineWorkflow({
      name: "one",
      run: (ctx) => ctx.call({ role: "explorer", task: "t", schema: answerSchema }),
    });
    const { outcome } = await run.execute(one, (step) => ({
      kind: "answer",
      messages: [
        {
          text: step.k === 1 ? 'Here it is: {"summary":3}' : 'Fixed: {"summary":"ok","score":1}',
          phase: "final_answer",
        },
      ],
      usage: { input: 10, output: 1 },
    }));
    expect(outcome).toEqual({ state: "completed", result: { summary: "ok", score: 1 } });
    const all = run.rows();
    const steps = ofType(all, "step_published");
    expect(steps.map((x) => x.action)).toEqual(["spawn", "send_input"]);
    expect(steps[1]?.repair?.answer).toBe('Here it is: {"summary":3}');
    expect(ofType(all, "completed")[0]).toMatchObject({ k: 2, extracted: true });
  });

  it("an extracted object that fails the schema after its repair too ends the call null_model (S000-088)", async () => {
    run = await inProcessRun();
    const one = defineWorkflow({
      name: "one",
      run: (ctx) =>
        ctx.call({ role: "explorer", task: "t", schema: answerSchema }).catch((e: Error) => e.name),
    });
    const { outcome } = await run.execute(one, () => ({
      kind: "answer",
      messages: [{ text: 'Here it is: {"summary":3}', phase: "final_answer" }],
      usage: { input: 10, output: 1 },
    }));
    expect(outcome).toEqual({ state: "completed", result: "FlowCallError" });
    const all = run.rows();
    expect(ofType(all, "step_published").map((x) => x.action)).toEqual(["spawn", "send_input"]);
    expect(ofType(all, "null_model")).toEqual([
      expect.objectContaining({
        reason: "answer_invalid_after_repair",
        raw_text: 'Here it is: {"summary":3}',
      }),
    ]);
    expect(ofType(all, "completed")).toEqual([]);
  });
});

/**
 * The explorer answers its first turn with prose; its repair turn is then cut off (its thread unloaded,
 * or the turn failed on the host and the run paused and was resumed by a second process), so a later
 * attempt takes the repair again on a new subagent.
 */
describe("a repair taken again by a later attempt", () => {
  const one = defineWorkflow({
    name: "one",
    run: (ctx) => ctx.call({ role: "explorer", task: "count things", schema: answerSchema }),
  });
  /** Runs the first turn with a prose answer, then binds the repair turn on the same subagent. */
  async function toRepair(r: InProcessRun) {
    const first = await r.firstStep();
    const a = r.spawn(first, "explorer");
    expect(await r.report(first, a.threadId)).toBe("bound");
    r.fake.answer(a.threadId, "not json at all");
    await until("the repair step", () => ofType(r.rows(), "step_published").some((x) => x.k === 2));
    const repair = (await r.steps()).find((x) => x.k === 2);
    if (!repair) throw new Error("no repair step file");
    r.fake.sendInput(a.threadId, repair.message);
    expect(await r.report(repair, a.threadId)).toBe("bound");
    return a;
  }

  async function laterAttempt(r: InProcessRun) {
    await until("the repair's next attempt", () =>
      ofType(r.rows(), "step_published").some((x) => x.k > 2 || x.attempt > 1),
    );
    const step = (await r.steps()).find((x) => x.k > 2 || x.attempt > 1);
    if (!step) throw new Error("no later attempt's step file");
    return { step, packet: readFileSync(step.packet, "utf8") };
  }

  it("an attempt after a lost repair turn names the answer it repairs in its packet; the loss names the repair's k apart from its attempt (S000-019 S000-131)", async () => {
    run = await inProcessRun({ lostAfterMs: 300 });
    const r = run;
    const { done } = r.background(one);
    const a = await toRepair(r);
    r.fake.setThreadStatus(a.threadId, "notLoaded");
    const { step, packet } = await laterAttempt(r);
    const repairTurn = ofType(r.rows(), "turn_started").find((x) => x.k === 2);
    expect(ofType(r.rows(), "session_attempt_lost")).toEqual([
      expect.objectContaining({ k: 2, attempt: 1, agent_id: a.threadId, turn_id: repairTurn?.turn_id }),
    ]);
    expect(step.action).toBe("spawn");
    expect(packet).toContain("not json at all");
    const b = r.spawn(step, "explorer");
    expect(await r.report(step, b.threadId)).toBe("bound");
    r.fake.answer(b.threadId, '{"summary":"fixed","score":2}');
    expect(await done).toEqual({ state: "completed", result: { summary: "fixed", score: 2 } });
  });

  it("after a restart, the attempt that takes a held repair again goes on with that repair: its packet names the task once, the answer it repairs and the repair instruction (S000-019 S000-151)", async () => {
    run = await inProcessRun();
    const r = run;
    const first = r.background(one);
    const a = await toRepair(r);
    r.fake.failTurn(a.threadId, "internalServerError", { message: "boom" });
    expect(await first.done).toEqual({ state: "paused", reason: "held:explorer.1" });
    const second = r.background(one);
    const { step, packet } = await laterAttempt(r);
    expect(packet).toContain("not json at all");
    expect(packet.split("count things")).toHaveLength(2);
    expect(packet).toContain("Answer again");
    const b = r.spawn(step, "explorer");
    expect(await r.report(step, b.threadId)).toBe("bound");
    r.fake.answer(b.threadId, '{"summary":"fixed","score":2}');
    expect(await second.done).toEqual({ state: "completed", result: { summary: "fixed", score: 2 } });
    expect(ofType(r.rows(), "started")).toHaveLength(2);
  });

  it("a call resumed in its repair turn gets no second repair: an invalid answer there ends it null_model (S000-152)", async () => {
    run = await inProcessRun();
    const r = run;
    const caught = defineWorkflow({
      name: "one",
      run: (ctx) =>
        ctx
          .call({ role: "explorer", task: "count things", schema: answerSchema })
          .catch((e: Error) => e.name),
    });
    const first = r.background(caught);
    const a = await toRepair(r);
    r.fake.failTurn(a.threadId, "internalServerError", { message: "boom" });
    expect(await first.done).toEqual({ state: "paused", reason: "held:explorer.1" });
    const second = r.background(caught);
    const { step } = await laterAttempt(r);
    const b = r.spawn(step, "explorer");
    expect(await r.report(step, b.threadId)).toBe("bound");
    r.fake.answer(b.threadId, "still not json");
    await until("the call's end or another step", () =>
      r.rows().some((x) => x.type === "null_model" || (x.type === "step_published" && x.k > 3)),
    );
    const rows = r.rows();
    // the task turn, its repair, and the repair taken again by the resumed process: no repair after it
    expect(ofType(rows, "step_published").map((x) => [x.k, x.attempt])).toEqual([
      [1, 1],
      [2, 1],
      [3, 2],
    ]);
    expect(ofType(rows, "null_model")).toEqual([
      expect.objectContaining({ reason: "answer_invalid_after_repair", raw_text: "still not json" }),
    ]);
    expect(await second.done).toEqual({ state: "completed", result: "FlowCallError" });
  });
});
