import type { JournalRow, StepFile } from "@crw/flow";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  defineWorkflow,
  diedAfter,
  type InProcessRun,
  inProcessRun,
  countSchema as schema,
  until,
} from "./helpers/harness.js";

const one = defineWorkflow({
  name: "one",
  run: (ctx) => ctx.call({ role: "explorer", task: "count", schema }),
});

type End = "answered" | "failed" | "lost";

interface Outcome {
  rows: JournalRow[];
  interruptedTurn: string;
  next: StepFile;
  nextThread: string;
  result: unknown;
}

/**
 * A dead process asked to interrupt attempt 1's turn (usage_limit) and the turn then ended on the host as
 * `end` says (or, `lost`, its thread is gone from the host); a process resumes the run, and attempt 2 is
 * answered.
 */
async function interruptedThenResumed(end: End): Promise<Outcome> {
  const run = await inProcessRun(end === "lost" ? { lostAfterMs: 300 } : {});
  // the subagent took the step and its turn then ended (answered or failed), after the dead process asked to interrupt it
  const a = diedAfter(run, "interrupt");
  if (end === "answered") run.fake.answer(a.threadId, '{"n":1}');
  else if (end === "failed") run.fake.failTurn(a.threadId, "internalServerError");
  else run.fake.setThreadStatus(a.threadId, "notLoaded");

  runs.push(run);
  const { done } = run.background(one);
  const [next] = await run.steps().catch((e) => {
    const rows = run.rows().map((r) => JSON.stringify(r));
    throw new Error(`${e}\n${rows.join("\n")}`);
  });
  if (!next) throw new Error("no next attempt");
  const b = run.spawn(next, "explorer");
  expect(await run.report(next, b.threadId)).toBe("bound");
  run.fake.answer(b.threadId, '{"n":2}');
  // attempt 2's answer ends the call, unless an intent that is not its own holds it a second time
  await until("attempt 2's end", () => {
    const rows = run.rows();
    return rows.some((r) => r.type === "completed") || rows.filter((r) => r.type === "held").length > 1;
  });
  const result = run.rows().some((r) => r.type === "completed") ? await done : "held again";
  return { rows: run.rows(), interruptedTurn: a.turnId, next, nextThread: b.threadId, result };
}

const runs: InProcessRun[] = [];
/** The turn the interrupt named ended on the host, answered or failed. */
const outcomes = {} as Record<Exclude<End, "lost">, Outcome>;
/** The turn the interrupt named was lost with its thread. */
let lost: Outcome;

beforeAll(async () => {
  outcomes.answered = await interruptedThenResumed("answered");
  outcomes.failed = await interruptedThenResumed("failed");
  lost = await interruptedThenResumed("lost");
}, 60_000);

afterAll(async () => {
  for (const r of runs) await r.close();
});

const call = "explorer.1";
const ofCall = (o: Outcome) => o.rows.filter((r) => "call" in r && r.call === call);
const seqOf = (o: Outcome, pred: (r: JournalRow) => boolean) => {
  const r = ofCall(o).find(pred);
  if (!r) throw new Error("no such row");
  return r.seq;
};

describe("an interrupt goes with its turn across a restart", () => {
  it("the resumed process applies the interrupt to attempt 1's turn, the one the row names: held before attempt 2 is published (S000-109)", () => {
    for (const o of Object.values(outcomes)) {
      const held = seqOf(o, (r) => r.type === "held");
      const turn1 = seqOf(o, (r) => r.type === "turn_started" && r.attempt === 1);
      const step2 = seqOf(o, (r) => r.type === "step_published" && r.attempt === 2);
      expect(turn1).toBeLessThan(held);
      expect(held).toBeLessThan(step2);
      expect(o.next).toMatchObject({ k: 2, attempt: 2, action: "spawn" });
    }
  });

  it("that turn ends held for the row's reason whatever it came to: an answer or a failure (S000-110)", () => {
    for (const o of Object.values(outcomes)) {
      const before = ofCall(o).filter(
        (r) => r.seq < seqOf(o, (x) => x.type === "step_published" && x.attempt === 2),
      );
      expect(before.filter((r) => r.type === "held")).toEqual([
        expect.objectContaining({ reason: "usage_limit" }),
      ]);
      expect(before.some((r) => r.type === "completed")).toBe(false);
    }
  });

  it("the step the resumed process publishes again, after the interrupted turn, starts with no intent: it is answered and completes the call (S000-111)", () => {
    for (const o of Object.values(outcomes)) {
      expect(o.result).toEqual({ state: "completed", result: { n: 2 } });
      const t2 = seqOf(o, (r) => r.type === "turn_started" && r.attempt === 2);
      const after = ofCall(o).filter((r) => r.seq > t2);
      expect(after.some((r) => r.type === "completed")).toBe(true);
      expect(after.some((r) => r.type === "held")).toBe(false);
    }
  });

  it("the intent is read against the turn the row names and never moved onto another: one interrupt row, naming attempt 1's turn (S000-112)", () => {
    for (const o of Object.values(outcomes)) {
      const interrupts = o.rows.filter((r) => r.type === "interrupt_requested");
      expect(interrupts).toEqual([expect.objectContaining({ turn_id: o.interruptedTurn, attempt: 1 })]);
      const t2 = ofCall(o).find((r) => r.type === "turn_started" && r.attempt === 2);
      expect(t2).toMatchObject({ k: 2 });
      expect((t2 as { turn_id: string }).turn_id).not.toBe(o.interruptedTurn);
      expect(o.rows.filter((r) => r.type === "held")).toHaveLength(1);
    }
  });

  it("a new attempt after a lost one starts with no intent: attempt 1 is lost, not held, and attempt 2 is answered and completes the call (S000-111)", () => {
    const lostRows = ofCall(lost).filter((r) => r.type === "session_attempt_lost");
    expect(lostRows).toEqual([expect.objectContaining({ attempt: 1 })]);
    expect(lost.rows.filter((r) => r.type === "held")).toEqual([]);
    expect(lost.result).toEqual({ state: "completed", result: { n: 2 } });
    const t2 = seqOf(lost, (r) => r.type === "turn_started" && r.attempt === 2);
    expect(seqOf(lost, (r) => r.type === "session_attempt_lost")).toBeLessThan(t2);
    expect(ofCall(lost).some((r) => r.seq > t2 && r.type === "completed")).toBe(true);
  });
});

/**
 * The explorer's answer was not JSON, so the run published its repair as a send_input to the same
 * subagent; before the owner took it, the reviewer's turn hit the usage limit and the run paused: the
 * explorer's call was held with no turn to interrupt. The owner then took the send_input anyway, and the
 * subagent answered. A process resumes the run.
 */
describe("a send_input the owner took after the run stopped", () => {
  let r: InProcessRun;
  let paused: unknown;
  let rowsAtPause: JournalRow[];
  let repair: StepFile;
  let lateTurn: string;
  let outcome: unknown;
  let rows: JournalRow[];
  const two = defineWorkflow({
    name: "two",
    run: (ctx) =>
      Promise.all([
        ctx.call({ role: "explorer", task: "count", schema }),
        ctx.call({ role: "reviewer", task: "count", schema }),
      ]),
  });

  beforeAll(async () => {
    r = await inProcessRun();
    const first = r.background(two);
    const steps = await r.steps(2);
    const ex = steps.find((s) => s.call === "explorer.1");
    const rv = steps.find((s) => s.call === "reviewer.1");
    if (!ex || !rv) throw new Error("no steps");
    const a = r.spawn(ex, "explorer");
    const b = r.spawn(rv, "reviewer");
    expect(await r.report(ex, a.threadId)).toBe("bound");
    expect(await r.report(rv, b.threadId)).toBe("bound");
    r.fake.answer(a.threadId, "about five, I think");
    const deadline = Date.now() + 10_000;
    for (;;) {
      const found = (await r.steps(1)).find((s) => s.call === "explorer.1" && s.k === 2);
      if (found) {
        repair = found;
        break;
      }
      if (Date.now() > deadline) throw new Error("no repair step");
      await new Promise((ok) => setTimeout(ok, 10));
    }
    expect(repair).toMatchObject({ action: "send_input", agent_id: a.threadId, attempt: 1 });
    r.fake.failTurn(b.threadId, "usageLimitExceeded");
    paused = await first.done;
    rowsAtPause = r.rows();
    // the owner takes the step late, and the subagent answers it
    lateTurn = r.fake.sendInput(a.threadId, repair.message);
    r.fake.answer(a.threadId, '{"n":5}');
    const second = r.background(two);
    const [again] = await r.steps(1);
    if (again?.call !== "reviewer.1") throw new Error(`unexpected step ${again?.call}`);
    const c = r.spawn(again, "reviewer");
    expect(await r.report(again, c.threadId)).toBe("bound");
    r.fake.answer(c.threadId, '{"n":1}');
    outcome = await second.done;
    rows = r.rows();
  }, 60_000);
  afterAll(() => r?.close());

  const explorer = (list: JournalRow[]) => list.filter((x) => "call" in x && x.call === "explorer.1");

  it("the stop found no turn for the untaken step: the call was held with no interrupt", () => {
    expect(paused).toEqual({ state: "paused", reason: "usage_limit" });
    expect(explorer(rowsAtPause).at(-1)).toMatchObject({ type: "held", reason: "usage_limit" });
    expect(explorer(rowsAtPause).some((x) => x.type === "interrupt_requested")).toBe(false);
  });

  it("the turn the host started for that step after the stop starts with no intent: the resume binds it and harvests its answer (S000-111)", () => {
    expect(outcome).toEqual({ state: "completed", result: [{ n: 5 }, { n: 1 }] });
    const own = explorer(rows);
    expect(own.find((x) => x.type === "turn_started" && x.k === 2)).toMatchObject({
      turn_id: lateTurn,
      attempt: 1,
    });
    expect(own.find((x) => x.type === "completed")).toMatchObject({ k: 2, attempt: 1, result: { n: 5 } });
    // no new attempt was published for it, and nothing interrupted the late turn
    expect(own.filter((x) => x.type === "step_published").map((x) => (x as { k: number }).k)).toEqual([1, 2]);
    expect(own.some((x) => x.type === "interrupt_requested")).toBe(false);
    expect(r.fake.state.turn(repair.agent_id as string, lateTurn).status).toBe("completed");
  });
});
