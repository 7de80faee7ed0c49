import type { JournalRow } from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import {
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  countSchema as schema,
  until,
} from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const of = <T extends JournalRow["type"]>(rows: JournalRow[], type: T) =>
  rows.filter((r): r is Extract<JournalRow, { type: T }> => r.type === type);

describe("conversation places of a call's turns", () => {
  it("the task turn is 1 and the repair 2 whatever subagent and attempt; a lost turn run again on a new subagent records replaces_turn, at publish and at bind (S000-021 S000-022)", async () => {
    run = await inProcessRun({ lostAfterMs: 300 });
    const r = run;
    const { done } = r.background(
      defineWorkflow({ name: "conv", run: (ctx) => ctx.call({ role: "explorer", task: "count", schema }) }),
    );
    const s1 = await r.firstStep();
    const a = r.spawn(s1, "explorer");
    expect(await r.report(s1, a.threadId)).toBe("bound");
    r.fake.setThreadStatus(a.threadId, "notLoaded"); // lost: the turn is run again on a new subagent
    await until("attempt 2's step", () => of(r.rows(), "step_published").length === 2);
    const s2 = (await r.steps()).find((s) => s.attempt === 2);
    if (!s2) throw new Error("no attempt 2 step");
    const b = r.spawn(s2, "explorer");
    expect(await r.report(s2, b.threadId)).toBe("bound");
    r.fake.answer(b.threadId, "not json at all"); // the repair: conversation turn 2 on the same subagent
    await until("the repair's step", () => of(r.rows(), "step_published").length === 3);
    const s3 = (await r.steps()).find((s) => s.k === 2);
    if (!s3) throw new Error("no repair step");
    r.fake.sendInput(b.threadId, s3.message);
    expect(await r.report(s3, b.threadId)).toBe("bound");
    r.fake.answer(b.threadId, '{"n":3}');
    expect(await done).toEqual({ state: "completed", result: { n: 3 } });

    const published = of(r.rows(), "step_published").map((p) => ({
      k: p.k,
      attempt: p.attempt,
      conversation_turn: p.conversation_turn,
      replaces_turn: p.replaces_turn,
    }));
    expect(published).toEqual([
      { k: 1, attempt: 1, conversation_turn: 1, replaces_turn: undefined },
      { k: 1, attempt: 2, conversation_turn: 1, replaces_turn: 1 },
      { k: 2, attempt: 2, conversation_turn: 2, replaces_turn: undefined },
    ]);
    const turns = of(r.rows(), "turn_started").map((t) => [t.attempt, t.conversation_turn, t.replaces_turn]);
    expect(turns).toEqual([
      [1, 1, undefined],
      [2, 1, 1],
      [2, 2, undefined],
    ]);
  });
  it("a held task turn run again at k 2 is still turn 1, and its repair at k 3 is turn 2: the place its step and its bind record, never one taken from k (S000-021 S000-162)", async () => {
    run = await inProcessRun();
    const r = run;
    const one = defineWorkflow({
      name: "conv",
      run: (ctx) => ctx.call({ role: "explorer", task: "count", schema }),
    });
    const first = r.background(one);
    const s1 = await r.firstStep();
    const a = r.spawn(s1, "explorer");
    expect(await r.report(s1, a.threadId)).toBe("bound");
    r.fake.failTurn(a.threadId, "internalServerError"); // the call is held and the run pauses
    expect(await first.done).toMatchObject({ state: "paused" });
    const second = r.background(one);
    await until("the held call's next step", () => of(r.rows(), "step_published").length === 2);
    const s2 = (await r.steps()).find((s) => s.k === 2);
    if (!s2) throw new Error("no step at k 2");
    const b = r.spawn(s2, "explorer");
    expect(await r.report(s2, b.threadId)).toBe("bound");
    r.fake.answer(b.threadId, "not json at all");
    await until("the repair's step", () => of(r.rows(), "step_published").length === 3);
    const s3 = (await r.steps()).find((s) => s.k === 3);
    if (!s3) throw new Error("no repair step at k 3");
    r.fake.sendInput(b.threadId, s3.message);
    expect(await r.report(s3, b.threadId)).toBe("bound");
    r.fake.answer(b.threadId, '{"n":4}');
    expect(await second.done).toEqual({ state: "completed", result: { n: 4 } });

    const published = of(r.rows(), "step_published").map((p) => [p.k, p.attempt, p.conversation_turn]);
    expect(published).toEqual([
      [1, 1, 1],
      [2, 2, 1],
      [3, 2, 2],
    ]);
    const turns = of(r.rows(), "turn_started").map((t) => [t.k, t.attempt, t.conversation_turn]);
    expect(turns).toEqual([
      [1, 1, 1],
      [2, 2, 1],
      [3, 2, 2],
    ]);
  });
});
