import { afterEach, describe, expect, it } from "vitest";
import { answerSchema, defineWorkflow, type InProcessRun, inProcessRun, json } from "./helpers/harness.js";

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
  it("S000-001 S000-002 S000-003: every call runs as a session call the owner spawns; the engine starts no thread or turn", async () => {
    run = await inProcessRun();
    const { outcome } = await run.execute(pair, (step) =>
      json({ summary: `answer to ${step.call}`, score: step.k }),
    );
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
    const types = rows.map((r) => r.type);
    expect(types[0]).toBe("started");
    expect(types.filter((t) => t === "completed")).toHaveLength(3);
    expect(types.at(-1)).toBe("run_ended");
  });

  it("S000-005 S000-166 S000-300 S000-210: started records backend session and pins role_pairs; prepared records backend and allocation", async () => {
    run = await inProcessRun();
    await run.execute(pair, () => json({ summary: "x", score: 1 }));
    const rows = run.rows();
    const started = rows.find((r) => r.type === "started");
    expect(started).toMatchObject({ backend: "session", process_n: 1, process: null });
    if (started?.type !== "started") throw new Error("no started row");
    expect(Object.keys(started.role_pairs).sort()).toEqual(
      ["architect", "critic", "executor", "executor-t1", "explorer", "reviewer"].sort(),
    );
    expect(started.policy_digest).toMatch(/^sha256:/);
    const prepared = rows.filter((r) => r.type === "prepared");
    expect(prepared).toHaveLength(3);
    for (const p of prepared) {
      if (p.type !== "prepared") continue;
      expect(p.backend).toBe("session");
      expect(p.allocation.workspace).toBe(`${run.paths.workspaces}/${p.call}`);
    }
  });

  it("S000-015 S000-016 S000-024 S000-075 S000-078 S000-014: step_published, then bind rows in one batch with cwd P and host_cwd", async () => {
    run = await inProcessRun();
    await run.execute(pair, () => json({ summary: "x", score: 1 }));
    const rows = run.rows().filter((r) => "call" in r && r.call === "explorer.1");
    const types = rows.map((r) => r.type);
    expect(types).toEqual(["prepared", "step_published", "thread_started", "turn_started", "completed"]);
    const step = rows[1];
    if (step?.type !== "step_published") throw new Error("no step");
    expect(step).toMatchObject({
      k: 1,
      op: "explorer.1/t1",
      marker: "explorer.1/t1-a1",
      attempt: 1,
      action: "spawn",
      input: "find A",
      role: "explorer",
      agent_type: "explorer",
      workspace: `${run.paths.workspaces}/explorer.1`,
      packet: `${run.paths.steps}/explorer.1/packet-t1-a1.md`,
      conversation_turn: 1,
    });
    expect(step.input_digest).toMatch(/^sha256:/);
    expect(step.packet_digest).toMatch(/^sha256:/);
    const ts = rows[2];
    const tu = rows[3];
    if (ts?.type !== "thread_started" || tu?.type !== "turn_started") throw new Error("no bind rows");
    expect(ts.seq + 1).toBe(tu.seq);
    expect(ts.at).toBe(tu.at); // one batch
    expect(ts).toMatchObject({
      cwd: `${run.paths.workspaces}/explorer.1`,
      host_cwd: `${run.root}/repo`,
      parent_thread_id: run.owner,
      agent_role: "explorer",
      via: "session",
      marker: "explorer.1/t1-a1",
      attempt: 1,
      pair_unchecked: true,
    });
    expect(ts.rollout_path).toBeTruthy();
    expect(tu).toMatchObject({
      k: 1,
      op: "explorer.1/t1",
      attempt: 1,
      marker: "explorer.1/t1-a1",
      conversation_turn: 1,
    });
  });

  it("S000-027 S000-017 S000-019 S000-020 S000-088 S000-093 S000-094 S000-079: an invalid answer gets one repair on the open subagent", async () => {
    run = await inProcessRun();
    const one = defineWorkflow({
      name: "one",
      run: (ctx) => ctx.call({ role: "explorer", task: "count things", schema: answerSchema }),
    });
    const { outcome } = await run.execute(one, (step) =>
      step.k === 1
        ? {
            kind: "answer",
            messages: [{ text: "not json at all", phase: "final_answer" }],
            usage: { input: 100, output: 10, cached_input: 40 },
          }
        : {
            kind: "answer",
            messages: [{ text: '{"summary":"fixed","score":2}', phase: "final_answer" }],
            usage: { input: 50, output: 5 },
          },
    );
    expect(outcome).toEqual({ state: "completed", result: { summary: "fixed", score: 2 } });
    const rows = run.rows().filter((r) => "call" in r && r.call === "explorer.1");
    expect(rows.map((r) => r.type)).toEqual([
      "prepared",
      "step_published",
      "thread_started",
      "turn_started",
      "step_published",
      "turn_started",
      "completed",
    ]);
    const repair = rows[4];
    const first = rows[2];
    if (repair?.type !== "step_published" || first?.type !== "thread_started") throw new Error("rows");
    expect(repair).toMatchObject({
      k: 2,
      attempt: 1,
      action: "send_input",
      agent_id: first.thread_id,
      marker: "explorer.1/t2-a1",
      previous_answer: "not json at all",
      repair: { answer: "not json at all" },
      tokens_seen: { input: 100, cached_input: 40, output: 10, total: 110 },
      call_tokens: { input: 100, cached_input: 40, output: 10, total: 110 },
      conversation_turn: 2,
    });
    const completed = rows[6];
    if (completed?.type !== "completed") throw new Error("no completed row");
    // the rollout's last count less what the subagent's earlier turn counted, part by part, plus that turn
    expect(completed.tokens).toEqual({ input: 150, cached_input: 40, output: 15, total: 165 });
  });

  it("S000-087 S000-084 S000-086: prose before the JSON is extracted; commentary is never the answer", async () => {
    run = await inProcessRun();
    const one = defineWorkflow({
      name: "one",
      run: (ctx) => ctx.call({ role: "explorer", task: "t", schema: answerSchema }),
    });
    const { outcome } = await run.execute(one, () => ({
      kind: "answer",
      messages: [
        { text: '{"summary":"draft","score":0}', phase: "commentary" },
        { text: 'Here is my answer:\n{"summary":"done","score":3}', phase: "final_answer" },
      ],
      usage: { input: 10, output: 0 },
    }));
    expect(outcome).toEqual({ state: "completed", result: { summary: "done", score: 3 } });
    const completed = run.rows().find((r) => r.type === "completed");
    expect(completed).toMatchObject({
      raw_text: 'Here is my answer:\n{"summary":"done","score":3}',
      extracted: true,
      tokens: { input: 10, total: 10 },
    });
    if (completed?.type === "completed") expect(completed.tokens).not.toHaveProperty("output"); // S000-095
  });

  it("S000-095 S000-152: a second invalid answer ends the call null_model; the workflow sees a FlowCallError", async () => {
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

  it("S000-125 S000-028: the subagent is closed once the call has its terminal row (a close step per subagent)", async () => {
    run = await inProcessRun();
    const { ownerKit } = await run.execute(pair, () => json({ summary: "x", score: 1 }));
    const closes = ownerKit.taken.filter((s) => s.action === "close");
    expect(closes.map((c) => c.call).sort()).toEqual(["architect.1", "explorer.1", "reviewer.1"]);
    for (const c of closes)
      expect(run.fake.state.get(c.agent_id as string).thread.status.type).toBe("notLoaded");
  });

  it("S000-074: a spawn the owner never reports is bound by its marker on the host", async () => {
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

  it("S000-091: an exceeded context window is a null_model", async () => {
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
