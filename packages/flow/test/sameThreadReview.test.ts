import type { JournalRow } from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import {
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  countSchema as schema,
  showRun,
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

describe("same-thread review", () => {
  it("a review bound to the author's own subagent is observed as a warning, never refused (S000-309)", async () => {
    run = await inProcessRun({});
    const r = run;
    const wf = defineWorkflow({
      name: "review",
      run: async (ctx) => {
        const built = await ctx.call<{ n: number }>({ role: "executor", task: "build", schema });
        const review = await ctx.call<{ n: number }>({ role: "reviewer", task: "review the build", schema });
        const other = await ctx.call<{ n: number }>({ role: "critic", task: "criticise it", schema });
        return [built.n, review.n, other.n];
      },
    });
    const { done } = r.background(wf);
    const ex = await stepOf(r, "executor.1");
    const author = r.spawn(ex, "worker");
    expect(await r.report(ex, author.threadId)).toBe("bound");
    r.fake.answer(author.threadId, '{"n":1}', { input: 100, output: 10 });
    // the owner sends the review to the author's thread instead of spawning a reviewer
    const rv = await stepOf(r, "reviewer.1");
    r.fake.sendInput(author.threadId, rv.message);
    expect(await r.report(rv, author.threadId)).toBe("bound");
    r.fake.answer(author.threadId, '{"n":2}', { input: 50, output: 5 });
    // a review on a thread of its own is no warning
    const cr = await stepOf(r, "critic.1");
    const critic = r.spawn(cr, "reviewer");
    expect(await r.report(cr, critic.threadId)).toBe("bound");
    r.fake.answer(critic.threadId, '{"n":3}');
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
    const tokensOf = (call: string) =>
      rows.find(
        (x): x is Extract<JournalRow, { type: "completed" }> => x.type === "completed" && x.call === call,
      )?.tokens;
    expect(tokensOf("executor.1")).toEqual({ input: 100, output: 10, total: 110 });
    expect(tokensOf("reviewer.1")).toEqual({ input: 50, output: 5, total: 55 });
    // crw flow show names the warning on the call, with the pair its subagent runs
    const shown = await showRun(r);
    expect(shown.calls.find((c) => c.call === "reviewer.1")).toMatchObject({
      warnings: expect.arrayContaining(["same_thread_review"]),
      subagents: [author.threadId],
      pair: { model: "mock-model" },
    });
    expect(shown.calls.find((c) => c.call === "critic.1")?.warnings).not.toContain("same_thread_review");
  });
});
