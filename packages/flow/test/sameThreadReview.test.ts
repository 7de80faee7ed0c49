import { rmSync } from "node:fs";
import { type JournalRow, listStepFiles } from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import {
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  countSchema as schema,
  showRun,
  until,
} from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

async function stepOf(r: InProcessRun, call: string) {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const step = (await r.steps(1)).find((s) => s.call === call);
    if (step) return step;
    if (Date.now() > deadline) throw new Error(`no step of ${call}`);
    await new Promise((res) => setTimeout(res, 20));
  }
}

const review = defineWorkflow({
  name: "review",
  run: async (ctx) => {
    const built = await ctx.call<{ n: number }>({ role: "executor", task: "build", schema });
    const review = await ctx.call<{ n: number }>({ role: "reviewer", task: "review the build", schema });
    const other = await ctx.call<{ n: number }>({ role: "critic", task: "criticise it", schema });
    return [built.n, review.n, other.n];
  },
});

/**
 * The review workflow up to the review's turn: the author's subagent builds (100 input, 10 output tokens),
 * and the owner sends the review to the author's thread instead of spawning a reviewer.
 */
async function reviewOnAuthor(r: InProcessRun) {
  const { done } = r.background(review);
  const ex = await stepOf(r, "executor.1");
  const author = r.spawn(ex, "worker");
  expect(await r.report(ex, author.threadId)).toBe("bound");
  r.fake.answer(author.threadId, '{"n":1}', { input: 100, output: 10 });
  const rv = await stepOf(r, "reviewer.1");
  r.fake.sendInput(author.threadId, rv.message);
  expect(await r.report(rv, author.threadId)).toBe("bound");
  return { done, author };
}

/** The critic's call on a subagent of its own, answered: the workflow's last. */
async function criticAnswers(r: InProcessRun) {
  const cr = await stepOf(r, "critic.1");
  const critic = r.spawn(cr, "reviewer");
  expect(await r.report(cr, critic.threadId)).toBe("bound");
  r.fake.answer(critic.threadId, '{"n":3}');
}

const tokensOf = (rows: JournalRow[], call: string) =>
  rows.find((x): x is Extract<JournalRow, { type: "completed" }> => x.type === "completed" && x.call === call)
    ?.tokens;

describe("same-thread review", () => {
  it("a review bound to the author's own subagent is observed as a warning, never refused (S000-309)", async () => {
    run = await inProcessRun({});
    const r = run;
    const { done, author } = await reviewOnAuthor(r);
    r.fake.answer(author.threadId, '{"n":2}', { input: 50, output: 5 });
    // a review on a thread of its own is no warning
    await criticAnswers(r);
    expect(await done).toEqual({ state: "completed", result: [1, 2, 3] });
    const rows = r.rows();
    const warnings = rows.filter(
      (x): x is Extract<JournalRow, { type: "flow_warning" }> =>
        x.type === "flow_warning" && x.warning === "same_thread_review",
    );
    expect(warnings).toEqual([
      expect.objectContaining({
        call: "reviewer.1",
        op: "reviewer.1/t1",
        detail: { thread_id: author.threadId, author_call: "executor.1", role: "reviewer" },
      }),
    ]);
    const reviewThread = rows.find((x) => x.type === "thread_started" && x.call === "reviewer.1");
    expect(reviewThread).toMatchObject({ thread_id: author.threadId });
    expect(rows.find((x) => x.type === "completed" && x.call === "reviewer.1")).toMatchObject({
      result: { n: 2 },
    });
    // the review counts its own turn only: the author's turn on that thread was the author's
    expect(tokensOf(rows, "executor.1")).toEqual({ input: 100, output: 10, total: 110 });
    expect(tokensOf(rows, "reviewer.1")).toEqual({ input: 50, output: 5, total: 55 });
    // crw flow show names the warning on the call, with the pair its subagent runs
    const shown = await showRun(r);
    expect(shown.calls.find((c) => c.call === "reviewer.1")).toMatchObject({
      warnings: expect.arrayContaining(["same_thread_review"]),
      subagents: [author.threadId],
      pair: { model: "mock-model" },
    });
    expect(shown.calls.find((c) => c.call === "critic.1")?.warnings).not.toContain("same_thread_review");
  });

  it("a review whose first answer is invalid and unmeasured counts only its own turns after the repair", async () => {
    run = await inProcessRun({});
    const r = run;
    const { done, author } = await reviewOnAuthor(r);
    // the review's first answer is no JSON, and its rollout is gone when the harvest reads its count
    r.fake.answer(author.threadId, "no json here");
    rmSync(r.fake.state.get(author.threadId).thread.path as string);
    const repairOf = () =>
      listStepFiles(r.paths.steps).steps.find((s) => s.call === "reviewer.1" && s.k === 2);
    await until("the review's repair", () => repairOf() !== undefined);
    const repair = repairOf() as NonNullable<ReturnType<typeof repairOf>>;
    expect(repair).toMatchObject({ action: "send_input", agent_id: author.threadId });
    r.fake.sendInput(author.threadId, repair.message);
    expect(await r.report(repair, author.threadId)).toBe("bound");
    r.fake.answer(author.threadId, '{"n":2}', { input: 50, output: 5 });
    await criticAnswers(r);
    expect(await done).toEqual({ state: "completed", result: [1, 2, 3] });
    const rows = r.rows();
    const unmeasured = rows.filter((x) => x.type === "tokens_unmeasured" && x.call === "reviewer.1");
    expect(unmeasured).toEqual([expect.objectContaining({ k: 1 })]);
    // the author's turn, counted before the review began, is the executor's and not the review's again
    expect(tokensOf(rows, "executor.1")).toEqual({ input: 100, output: 10, total: 110 });
    expect(tokensOf(rows, "reviewer.1")).toEqual({ input: 50, output: 5, total: 55 });
  });
});
