import type { JournalRow } from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import {
  defineWorkflow,
  diedAfter,
  type InProcessRun,
  inProcessRun,
  rowsOfType,
  countSchema as schema,
  until,
} from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const one = defineWorkflow({
  name: "one",
  run: (ctx) => ctx.call({ role: "explorer", task: "count", schema }),
});
const call = "explorer.1";

/** The owner takes attempt 2's step and its subagent answers: the run completes. */
async function answerAttempt2(r: InProcessRun, n: number): Promise<void> {
  await until("attempt 2's step", () => rowsOfType(r.rows(), "step_published").length === 2);
  const step = (await r.steps()).find((s) => s.attempt === 2);
  if (!step) throw new Error("no attempt 2 step");
  const b = r.spawn(step, "explorer");
  expect(await r.report(step, b.threadId)).toBe("bound");
  r.fake.answer(b.threadId, JSON.stringify({ n }));
}

const heldRows = (r: InProcessRun) =>
  rowsOfType(r.rows(), "held") as Array<Extract<JournalRow, { type: "held" }>>;

describe("a resumed process finishes the interrupt the dead one asked for", () => {
  it("a turn still running is interrupted once, and the call is held with what the turn came to", async () => {
    // a long poll: the harvest waits for the host's notification that the turn ended, not for the clock
    run = await inProcessRun({ pollMs: 1_000, lostAfterMs: 60_000 });
    const r = run;
    const a = diedAfter(r, "interrupt");
    r.fake.setInterruptDelay(300);
    const interrupts: string[] = [];
    r.fake.onRequest((method, params) => {
      if (method === "turn/interrupt") interrupts.push((params as { turnId: string }).turnId);
    });
    const { done } = r.background(one);
    await until("the held row", () => heldRows(r).length === 1);
    expect(interrupts).toEqual([a.turnId]);
    expect(r.fake.state.turn(a.threadId, a.turnId).status).toBe("interrupted");
    expect(heldRows(r)[0]).toMatchObject({
      call,
      reason: "usage_limit",
      detail: "the turn interrupted after the interrupt",
    });
    await answerAttempt2(r, 2);
    expect(await done).toEqual({ state: "completed", result: { n: 2 } });
    expect(rowsOfType(r.rows(), "completed")).toHaveLength(1);
  });

  it("a turn that completed meanwhile is held, its answer never taken: the detail says how it ended", async () => {
    run = await inProcessRun();
    const r = run;
    const a = diedAfter(r, "interrupt");
    r.fake.answer(a.threadId, '{"n":1}');
    const { done } = r.background(one);
    await answerAttempt2(r, 5);
    expect(await done).toEqual({ state: "completed", result: { n: 5 } });
    expect(heldRows(r)).toEqual([
      expect.objectContaining({ reason: "usage_limit", detail: "the turn completed after the interrupt" }),
    ]);
  });

  it("a subagent the host does not know, with an interrupt asked for, loses its attempt after LostAfter", async () => {
    run = await inProcessRun({ lostAfterMs: 300 });
    const r = run;
    const a = diedAfter(r, "interrupt");
    r.fake.state.threads.delete(a.threadId);
    const { done } = r.background(one);
    await until("the lost row", () => rowsOfType(r.rows(), "session_attempt_lost").length === 1);
    expect(rowsOfType(r.rows(), "session_attempt_lost")[0]).toMatchObject({
      attempt: 1,
      agent_id: a.threadId,
      host_status: "unknown",
      turn_status: null,
    });
    await answerAttempt2(r, 3);
    expect(await done).toEqual({ state: "completed", result: { n: 3 } });
  });
});
