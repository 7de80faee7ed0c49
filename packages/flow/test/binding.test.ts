import { afterEach, describe, expect, it } from "vitest";
import { defineWorkflow, type InProcessRun, inProcessRun, countSchema as schema } from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const one = (role: "explorer" | "executor" = "explorer") =>
  defineWorkflow({ name: "one", run: (ctx) => ctx.call({ role, task: "count", schema }) });

describe("binding a reported subagent", () => {
  it("S000-057 S000-059: a subagent on another pair gets pair_mismatch naming the role's pair; the step stays; the right pair binds", async () => {
    run = await inProcessRun({ roles: { explorer: { model: "m-explore", effort: "high" } } });
    const { done } = run.background(one());
    const step = await run.firstStep();
    expect(step).toMatchObject({ model: "m-explore", reasoning_effort: "high", agent_type: "explorer" });
    const wrong = run.spawn(step, "explorer", { model: "other", reasoningEffort: "high" });
    expect(await run.report(step, wrong.threadId)).toBe("pair_mismatch");
    const reply = JSON.parse(
      (await import("node:fs")).readFileSync(
        `${run.paths.replies}/${(await import("@crw/flow")).reportName(step.call, 1, 1, wrong.threadId)}`,
        "utf8",
      ),
    );
    expect(reply.pair).toEqual({ model: "m-explore", effort: "high" });
    expect(await run.steps()).toHaveLength(1); // the step stays
    const right = run.spawn(step, "explorer", { model: "m-explore", reasoningEffort: "high" });
    expect(await run.report(step, right.threadId)).toBe("bound");
    run.fake.answer(right.threadId, '{"n":1}', { input: 1, output: 1 });
    expect(await done).toEqual({ state: "completed", result: { n: 1 } });
    const ts = run.rows().find((r) => r.type === "thread_started");
    expect(ts).toMatchObject({ thread_id: right.threadId, model: "m-explore", effort: "high" });
    expect(ts).not.toHaveProperty("pair_unchecked");
    expect(ts).not.toHaveProperty("effort_unchecked");
  });

  it("S000-069 S000-067: a model with an undecided effort binds on the model alone (effort_unchecked, the host's effort recorded)", async () => {
    run = await inProcessRun({ roles: { explorer: { model: "m-explore" } } });
    const { done } = run.background(one());
    const step = await run.firstStep();
    const a = run.spawn(step, "explorer", { model: "m-explore", reasoningEffort: "low" });
    expect(await run.report(step, a.threadId)).toBe("bound");
    run.fake.answer(a.threadId, '{"n":2}');
    await done;
    expect(run.rows().find((r) => r.type === "thread_started")).toMatchObject({
      effort: "low",
      effort_unchecked: true,
    });
  });

  it("S000-068: an agentRole other than the expected agent type is recorded session_agent_role_mismatch and bound", async () => {
    run = await inProcessRun();
    const { done } = run.background(one());
    const step = await run.firstStep();
    const a = run.spawn(step, "default");
    expect(await run.report(step, a.threadId)).toBe("bound");
    run.fake.answer(a.threadId, '{"n":3}');
    await done;
    expect(run.rows().find((r) => r.type === "thread_started")).toMatchObject({
      pair_unchecked: true,
      session_agent_role_mismatch: { expected: "explorer", actual: "default" },
    });
  });

  it("S000-060 S000-061 S000-063 S000-065 S000-066: retry, refused and close replies", async () => {
    run = await inProcessRun();
    const { done } = run.background(one());
    const step = await run.firstStep();
    // retry: no turn of the reported subagent carries the marker (yet)
    const noMarker = run.fake.spawnSubagent({
      ownerThreadId: run.owner,
      message: "hello",
      agentRole: "explorer",
    });
    expect(await run.report(step, noMarker.threadId)).toBe("retry");
    // refused: another run's report
    expect(await run.report(step, noMarker.threadId, "another-run")).toBe("refused");
    // refused: not a subagent of the owner thread
    const stranger = run.fake.createOwnerThread();
    run.fake.startOwnerTurn(stranger);
    const foreign = run.fake.spawnSubagent({
      ownerThreadId: stranger,
      message: step.message,
      agentRole: "explorer",
    });
    expect(await run.report(step, foreign.threadId)).toBe("refused");
    // close: a step the run did not publish (an early report)
    expect(await run.report({ call: step.call, k: 5, attempt: 1 }, noMarker.threadId)).toBe("close");
    const a = run.spawn(step, "explorer");
    expect(await run.report(step, a.threadId)).toBe("bound");
    // close: a second subagent for a bound attempt
    const second = run.spawn(step, "explorer");
    expect(await run.report(step, second.threadId)).toBe("close");
    run.fake.answer(a.threadId, '{"n":4}');
    expect(await done).toEqual({ state: "completed", result: { n: 4 } });
  });

  it("S000-064: a report for an attempt that was answered is told to close", async () => {
    run = await inProcessRun();
    const wf = defineWorkflow({
      name: "two",
      async run(ctx) {
        const a = await ctx.call({ role: "explorer", task: "first", schema });
        const b = await ctx.call({ role: "explorer", task: "second", schema });
        return [a, b];
      },
    });
    const { done } = run.background(wf);
    const s1 = await run.firstStep();
    const a = run.spawn(s1, "explorer");
    expect(await run.report(s1, a.threadId)).toBe("bound");
    run.fake.answer(a.threadId, '{"n":1}');
    const deadline = Date.now() + 5000;
    while (!run.rows().some((r) => r.type === "completed") && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 10));
    expect(await run.report(s1, a.threadId)).toBe("close");
    const [s2] = (await run.steps()).filter((s) => s.call === "explorer.2");
    if (!s2) throw new Error("no second step");
    const b = run.spawn(s2, "explorer");
    expect(await run.report(s2, b.threadId)).toBe("bound");
    run.fake.answer(b.threadId, '{"n":2}');
    expect(await done).toEqual({ state: "completed", result: [{ n: 1 }, { n: 2 }] });
  });
});
