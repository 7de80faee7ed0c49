import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  executeRun,
  type JournalRow,
  readJournalFile,
  runPaths,
  runSpent,
  TokenFigure,
  type Tokens,
  writeSpec,
} from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import {
  answerSchema,
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  rowsOfType as of,
  showRun,
} from "../helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

describe("the run's token figure", () => {
  it("recovered call tokens (in no terminal row) count when the resumed process takes them, ride on the terminal row, and are counted once (S000-098)", async () => {
    run = await inProcessRun();
    const one = defineWorkflow({
      name: "one",
      run: (ctx) => ctx.call({ role: "explorer", task: "count things", schema: answerSchema }),
    });
    // the first process: a task turn whose answer is invalid, then the repair on the open subagent
    let figureB: { run: Tokens; spent: Tokens } | null = null;
    const { outcome } = await run.execute(one, (step) =>
      step.k === 1
        ? {
            kind: "answer",
            messages: [{ text: "not json", phase: "final_answer" }],
            usage: { input: 100, output: 10, cached_input: 40 },
          }
        : {
            kind: "answer",
            messages: [{ text: '{"summary":"ok","score":1}', phase: "final_answer" }],
            usage: { input: 50, output: 5 },
          },
    );
    expect(outcome.state).toBe("completed");
    const full = run.rows();
    const completedA = of(full, "completed")[0] as Extract<JournalRow, { type: "completed" }>;
    expect(completedA.tokens).toEqual({ input: 150, cached_input: 40, output: 15, total: 165 });
    expect(runSpent(full)).toEqual(completedA.tokens);

    // The process that published the send_input repair died before it ended the call: its journal stops at
    // that step_published row, whose call_tokens (the task turn's count) are in no terminal row.
    const cut = full.findIndex((r) => r.type === "step_published" && r.action === "send_input");
    expect(cut).toBeGreaterThan(0);
    const repairRow = full[cut] as Extract<JournalRow, { type: "step_published" }>;
    expect(repairRow.call_tokens).toEqual({ input: 100, cached_input: 40, output: 10, total: 110 });
    const lines = readFileSync(run.paths.journal, "utf8").split("\n");
    const stateB = join(run.root, "state-b");
    const pathsB = runPaths(stateB, run.spec.run_id);
    mkdirSync(pathsB.dir, { recursive: true });
    writeSpec(pathsB.spec, run.spec);
    writeFileSync(pathsB.journal, `${lines.slice(0, cut + 2).join("\n")}\n`); // header + rows up to the cut
    const before = readJournalFile(pathsB.journal).rows;
    expect(runSpent(before)).toEqual({}); // nothing terminal yet: RunSpent holds none of it

    // the resumed process finds the repair turn on the subagent by its marker and harvests it
    const outcomeB = await executeRun({
      paths: pathsB,
      spec: run.spec,
      host: run.host,
      processToken: null,
      workflow: one,
      onTokens: (f) => {
        figureB = f;
      },
    });
    expect(outcomeB).toEqual({ state: "completed", result: { summary: "ok", score: 1 } });
    const rowsB = readJournalFile(pathsB.journal).rows;
    expect(of(rowsB, "step_published")).toHaveLength(2); // the repair was found on the host, not sent again
    const completedB = of(rowsB, "completed")[0] as Extract<JournalRow, { type: "completed" }>;
    // the terminal row carries the recovered tokens plus only what the repair turn added
    expect(completedB.tokens).toEqual({ input: 150, cached_input: 40, output: 15, total: 165 });
    // counted once: the process's spent() and RunSpent agree, not 110 + 165
    expect(figureB).toEqual({ run: completedB.tokens, spent: completedB.tokens });
    expect(runSpent(rowsB)).toEqual(completedB.tokens);
  });

  it("the token ceiling counts only the calls the run measured (tokens_unmeasured pauses: false); a resume keeps the journal's figure (S000-101)", async () => {
    run = await inProcessRun();
    const four = defineWorkflow({
      name: "four",
      run: async (ctx) => {
        const out: unknown[] = [];
        for (const task of ["a", "b", "c", "d"]) {
          out.push(await ctx.call({ role: "explorer", task, schema: answerSchema }));
        }
        return out;
      },
    });
    const answer = { summary: "s", score: 1 };
    const behave = (step: { call: string }) =>
      step.call === "explorer.2"
        ? // no usage: the rollout has no token count, the turn is unmeasured
          {
            kind: "answer" as const,
            messages: [{ text: JSON.stringify(answer), phase: "final_answer" as const }],
          }
        : {
            kind: "answer" as const,
            messages: [{ text: JSON.stringify(answer), phase: "final_answer" as const }],
            usage: { input: 100, output: 20 },
          };
    run.spec.token_ceiling = 200;
    writeSpec(run.paths.spec, run.spec);
    const first = await run.execute(four, behave);
    expect(first.outcome).toEqual({ state: "paused", reason: "token_ceiling" });
    let rows = run.rows();
    expect(of(rows, "tokens_unmeasured")).toEqual([
      expect.objectContaining({ call: "explorer.2", pauses: false }),
    ]);
    // 120 (measured) + nothing for the unmeasured call < 200: the third call starts; 240 >= 200: the fourth
    // does not
    expect(of(rows, "prepared").map((r) => (r as { call: string }).call)).toEqual([
      "explorer.1",
      "explorer.2",
      "explorer.3",
    ]);
    expect(of(rows, "run_paused")).toEqual([expect.objectContaining({ reason: "token_ceiling" })]);
    expect(runSpent(rows)).toEqual({ input: 200, output: 40, total: 240 });
    expect(of(rows, "run_ended")).toHaveLength(0);
    // crw flow show reports the run's figure (RunSpent) next to its ceiling
    const shown = await showRun(run);
    expect(shown).toMatchObject({
      status: "paused (token_ceiling)",
      tokens: { total: 240 },
      token_ceiling: 200,
    });

    // a resume still at the ceiling pauses again at once, from the journal's figure alone
    const again = await run.execute(four, behave);
    expect(again.outcome).toEqual({ state: "paused", reason: "token_ceiling" });
    expect(of(run.rows(), "prepared")).toHaveLength(3);

    // a resume with a higher ceiling (a run option over the spec's) goes on with the fourth call
    run.spec.token_ceiling = 1_000;
    const last = await run.execute(four, behave);
    expect(last.outcome).toEqual({ state: "completed", result: [answer, answer, answer, answer] });
    rows = run.rows();
    expect(runSpent(rows)).toEqual({ input: 300, output: 60, total: 360 });
  });
  it("reaching the ceiling pauses the run like a usage limit: a call in flight is interrupted and held, and goes on in place at the resume (S000-101)", async () => {
    run = await inProcessRun();
    const answer = { summary: "s", score: 1 };
    const wf = defineWorkflow({
      name: "inflight",
      run: async (ctx) => {
        const slow = ctx.call({ role: "explorer", task: "slow", schema: answerSchema });
        const chain = (async () => {
          const b = await ctx.call({ role: "explorer", task: "b", schema: answerSchema });
          const c = await ctx.call({ role: "explorer", task: "c", schema: answerSchema });
          return [b, c];
        })();
        const [a, bc] = await Promise.all([slow, chain]);
        return [a, ...bc];
      },
    });
    run.spec.token_ceiling = 100;
    let slowHangs = true;
    const behave = (step: { call: string }) =>
      step.call === "explorer.1" && slowHangs
        ? { kind: "hang" as const }
        : {
            kind: "answer" as const,
            messages: [{ text: JSON.stringify(answer), phase: "final_answer" as const }],
            usage: { input: 100, output: 20 },
          };
    const first = await run.execute(wf, behave);
    expect(first.outcome).toEqual({ state: "paused", reason: "token_ceiling" });
    let rows = run.rows();
    // The two calls run in parallel: their prepared rows land in either order.
    expect(
      of(rows, "prepared")
        .map((r) => (r as { call: string }).call)
        .sort(),
    ).toEqual(["explorer.1", "explorer.2"]);
    expect(of(rows, "interrupt_requested")).toEqual([expect.objectContaining({ call: "explorer.1" })]);
    expect(of(rows, "held")).toEqual([expect.objectContaining({ call: "explorer.1" })]);
    slowHangs = false;
    run.spec.token_ceiling = 10_000;
    const second = await run.execute(wf, behave);
    expect(second.outcome).toEqual({ state: "completed", result: [answer, answer, answer] });
    rows = run.rows();
    expect(of(rows, "prepared")).toHaveLength(3); // the held call went on in place, not prepared again
    expect(runSpent(rows)).toEqual({ input: 300, output: 60, total: 360 });
  });
  it("a call held with tokens and taken up by the next process is counted once by RunSpent and by spent() (S000-098)", () => {
    const at = new Date().toISOString();
    const row = (seq: number, r: Record<string, unknown>) => ({ seq, at, ...r }) as unknown as JournalRow;
    // the first process: the task turn measured 110, the repair turn held (its row carries the 110)
    const first = [
      row(1, {
        type: "completed",
        call: "a.1",
        op: "a.1",
        k: 1,
        attempt: 1,
        result: 1,
        result_digest: "x",
        raw_text: "1",
        extracted: false,
        tokens: { total: 40 },
      }),
      row(2, { type: "step_published", call: "b.1", call_tokens: { total: 110 } }),
      row(3, { type: "held", call: "b.1", op: "b.1", reason: "usage_limit", tokens: { total: 110 } }),
    ];
    expect(runSpent(first)).toEqual({ total: 150 });
    const figure = new TokenFigure(first);
    expect(figure.run()).toEqual({ total: 150 });
    // the next process publishes the repair again (the step carries the 110) and completes it with 55 more
    figure.observe([row(4, { type: "step_published", call: "b.1", call_tokens: { total: 110 } })]);
    expect(figure.spent()).toEqual({}); // the held row had them: nothing new was taken
    const done = row(5, {
      type: "completed",
      call: "b.1",
      op: "b.1",
      k: 3,
      attempt: 2,
      result: 1,
      result_digest: "x",
      raw_text: "1",
      extracted: false,
      tokens: { total: 165 },
    });
    figure.observe([done]);
    expect(figure.spent()).toEqual({ total: 55 });
    expect(figure.run()).toEqual({ total: 205 });
    expect(runSpent([...first, done])).toEqual(figure.run());
    // recovered tokens in no terminal row are taken by the process that writes a row carrying them
    const recovered = new TokenFigure([
      row(1, { type: "step_published", call: "c.1", call_tokens: { total: 70 } }),
    ]);
    expect(recovered.run()).toEqual({});
    // taken when the process writes a row carrying them (its step for the call again), before any end
    recovered.observe([row(2, { type: "step_published", call: "c.1", call_tokens: { total: 70 } })]);
    expect(recovered.spent()).toEqual({ total: 70 });
    expect(recovered.run()).toEqual({ total: 70 });
    recovered.observe([
      row(3, { type: "null_model", call: "c.1", op: "c.1", reason: "r", tokens: { total: 90 } }),
    ]);
    expect(recovered.spent()).toEqual({ total: 90 });
    expect(recovered.run()).toEqual({ total: 90 });
  });
});
