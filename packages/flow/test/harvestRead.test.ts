import { defineWorkflow, listStepFiles } from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import {
  type InProcessRun,
  inProcessRun,
  json,
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

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("the harvest's reads of a bound subagent", () => {
  it("a host that cannot be asked is asked again a poll later, not at once", async () => {
    // five unreachable answers in a row make the run say the host is down: a poll of 1 s keeps the
    // harvest's reads in a 2 s outage under that bound
    run = await inProcessRun({ pollMs: 1_000, lostAfterMs: 60_000 });
    const r = run;
    const { done } = r.background(one);
    const step = await r.firstStep();
    const agent = r.spawn(step, "explorer");
    expect(await r.report(step, agent.threadId)).toBe("bound");
    await r.fake.setUnreachable();
    await sleep(2_000);
    const warned = r.rows().filter((x) => x.type === "flow_warning" && x.warning === "host_unreachable");
    await r.fake.setReachable();
    r.fake.answer(agent.threadId, '{"n":6}');
    expect(await done).toEqual({ state: "completed", result: { n: 6 } });
    expect(warned).toEqual([]);
    expect(rowsOfType(r.rows(), "session_attempt_lost")).toEqual([]);
  });

  it("a completed turn ends the call at once: the workflow hears of it without waiting a poll", async () => {
    run = await inProcessRun({ pollMs: 3_000, lostAfterMs: 60_000 });
    const r = run;
    const { done } = r.background(one);
    const step = await r.firstStep();
    const agent = r.spawn(step, "explorer");
    expect(await r.report(step, agent.threadId)).toBe("bound");
    r.fake.answer(agent.threadId, '{"n":8}');
    expect(await done).toEqual({ state: "completed", result: { n: 8 } });
    const at = (type: string) => Date.parse(String(r.rows().find((x) => x.type === type)?.at));
    // the harvest that wrote the completed row returns to the call's loop, which sees the terminal row
    expect(at("run_ended") - at("completed")).toBeLessThan(1_500);
  });

  it("a turn interrupted on an exceeded context window ends the call null_model at once, without waiting a poll", async () => {
    run = await inProcessRun({ pollMs: 3_000, lostAfterMs: 60_000 });
    const r = run;
    const caught = defineWorkflow({
      name: "caught",
      run: (ctx) => ctx.call({ role: "explorer", task: "count", schema }).catch((e: Error) => e.message),
    });
    const { done } = r.background(caught);
    const step = await r.firstStep();
    const agent = r.spawn(step, "explorer");
    expect(await r.report(step, agent.threadId)).toBe("bound");
    r.fake.failTurn(agent.threadId, "contextWindowExceeded", { ended: "interrupted" });
    expect(await done).toMatchObject({ state: "completed" });
    const rows = r.rows();
    expect(rows.find((x) => x.type === "null_model")).toMatchObject({ reason: "context_window_exceeded" });
    const at = (type: string) => Date.parse(String(rows.find((x) => x.type === type)?.at));
    expect(at("run_ended") - at("null_model")).toBeLessThan(1_500);
    expect(rowsOfType(rows, "session_attempt_lost")).toEqual([]);
  });

  it("an outage longer than LostAfter runs no lost clock: a thread gone when the host is back loses its attempt only LostAfter later", async () => {
    run = await inProcessRun({ pollMs: 50, lostAfterMs: 600 });
    const r = run;
    const { done } = r.background(one);
    const step = await r.firstStep();
    const agent = r.spawn(step, "explorer");
    expect(await r.report(step, agent.threadId)).toBe("bound");
    await r.fake.setUnreachable();
    await sleep(1_200);
    r.fake.state.threads.delete(agent.threadId);
    await r.fake.setReachable();
    const back = Date.now();
    await until("the lost row", () => rowsOfType(r.rows(), "session_attempt_lost").length === 1);
    expect(Date.now() - back).toBeGreaterThanOrEqual(500);
    expect(rowsOfType(r.rows(), "session_attempt_lost")[0]).toMatchObject({ host_status: "unknown" });
    void done.catch(() => undefined);
  });

  it("a thread that no longer shows the bound turn is waited for, never a failure of the run", async () => {
    run = await inProcessRun({ lostAfterMs: 60_000 });
    const r = run;
    const { done } = r.background(one);
    const step = await r.firstStep();
    const agent = r.spawn(step, "explorer");
    expect(await r.report(step, agent.threadId)).toBe("bound");
    const turns = r.fake.state.get(agent.threadId).turns;
    const [bound] = turns.splice(0, turns.length);
    await sleep(400);
    expect(r.rows().some((x) => x.type === "run_ended")).toBe(false);
    if (bound) turns.push(bound);
    r.fake.answer(agent.threadId, '{"n":4}');
    expect(await done).toEqual({ state: "completed", result: { n: 4 } });
  });
});

/** The same call, its failure caught: the workflow ends either way. */
const caught = defineWorkflow({
  name: "caught",
  async run(ctx) {
    try {
      return await ctx.call({ role: "explorer", task: "count", schema });
    } catch (e) {
      return (e as Error).name;
    }
  },
});

const callEnded = (events: Array<{ type: string }>) => events.filter((e) => e.type === "call_ended");

describe("what the harvest of an answer tells the workflow's watchers", () => {
  it("a valid answer ends its call with a call_ended event of status completed", async () => {
    run = await inProcessRun();
    const { events } = await run.execute(one, () => json({ n: 4 }));
    expect(callEnded(events)).toEqual([{ type: "call_ended", call: "explorer.1", status: "completed" }]);
  });

  it("an answer still invalid after its repair ends the call with a call_ended event of status null_model", async () => {
    run = await inProcessRun();
    const { events } = await run.execute(caught, () => ({
      kind: "answer",
      messages: [{ text: "no json here" }],
    }));
    expect(callEnded(events)).toEqual([{ type: "call_ended", call: "explorer.1", status: "null_model" }]);
  });
});

describe("a subagent whose turns end with no answer message", () => {
  /** The caught call, its subagent ending each turn without a message: the repair and its end. */
  async function silentCall(r: InProcessRun) {
    await r.execute(caught, () => ({ kind: "answer", messages: [] }));
    const rows = r.rows();
    const repair = rows.find((x) => x.type === "step_published" && x.k === 2);
    return { repair, ended: rowsOfType(rows, "null_model")[0] };
  }
  const noAnswer = ["the turn ended with no final answer message"];

  it("the repair names the missing answer and quotes an empty one", async () => {
    run = await inProcessRun();
    const { repair } = await silentCall(run);
    expect(repair).toMatchObject({
      action: "send_input",
      previous_answer: "",
      repair: { answer: "", errors: noAnswer },
    });
    expect(repair).toMatchObject({ input: expect.stringContaining("Your answer was: \n") });
  });

  it("a repair that ends with no answer either ends the call null_model with the errors and no raw text", async () => {
    run = await inProcessRun();
    const { ended } = await silentCall(run);
    expect(ended).toMatchObject({ reason: "answer_invalid_after_repair", errors: noAnswer });
    expect(ended).not.toHaveProperty("raw_text");
  });
});

describe("an invalid answer on a thread the host no longer holds", () => {
  it.each(["systemError", "notLoaded"] as const)(
    "on a thread reading %s the repair goes to a new subagent, and the old one is closed",
    async (status) => {
      run = await inProcessRun({ lostAfterMs: 60_000 });
      const r = run;
      const { done } = r.background(caught);
      const s1 = await r.firstStep();
      const a = r.spawn(s1, "explorer");
      expect(await r.report(s1, a.threadId)).toBe("bound");
      // the answer lands and, in the same tick, the host loses the thread: the harvest reads both
      r.fake.answer(a.threadId, "no json here");
      r.fake.setThreadStatus(a.threadId, status);
      const repairOf = () => listStepFiles(r.paths.steps).steps.find((s) => s.k === 2);
      await until("the repair's step", () => repairOf() !== undefined);
      const repair = repairOf() as NonNullable<ReturnType<typeof repairOf>>;
      expect(repair).toMatchObject({ action: "spawn", attempt: 2, agent_id: null });
      const closes = listStepFiles(r.paths.steps).closes;
      expect(closes.map((c) => ({ attempt: c.attempt, agent_id: c.agent_id }))).toEqual([
        { attempt: 1, agent_id: a.threadId },
      ]);
      const b = r.spawn(repair, "explorer");
      expect(await r.report(repair, b.threadId)).toBe("bound");
      r.fake.answer(b.threadId, JSON.stringify({ n: 2 }));
      expect(await done).toEqual({ state: "completed", result: { n: 2 } });
    },
  );
});

describe("what a held call's row says", () => {
  /** The one call's subagent ends its turn failed with the host's error: the run's end and the held row. */
  async function failedWith(codexErrorInfo: string | null, message: string) {
    run = await inProcessRun();
    const { done } = run.background(one);
    const s1 = await run.firstStep();
    const a = run.spawn(s1, "explorer");
    expect(await run.report(s1, a.threadId)).toBe("bound");
    run.fake.failTurn(a.threadId, codexErrorInfo, { message });
    return { outcome: await done, held: rowsOfType(run.rows(), "held")[0] };
  }

  it("a usage limit's hold names the host's code and its message", async () => {
    const { outcome, held } = await failedWith("usageLimitExceeded", "try again at 5pm");
    expect(outcome).toEqual({ state: "paused", reason: "usage_limit" });
    expect(held).toMatchObject({ reason: "usage_limit", detail: "usageLimitExceeded: try again at 5pm" });
  });

  it("a host failure that names no error kind holds the call as failed, with the host's message", async () => {
    const { outcome, held } = await failedWith(null, "the stream broke");
    expect(outcome).toEqual({ state: "paused", reason: "held:explorer.1" });
    expect(held).toMatchObject({ reason: "host_failure", detail: "failed: the stream broke" });
  });
});
