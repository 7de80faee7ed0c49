import { listStepFiles, tryLock, unlock } from "@crw/flow";
import { afterEach, describe, expect, it, onTestFinished } from "vitest";
import { crwFlow, dispatchedArgs } from "./helpers/cli.js";
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

const one = (role: "explorer" | "executor" = "explorer") =>
  defineWorkflow({ name: "one", run: (ctx) => ctx.call({ role, task: "count", schema }) });

describe("binding a reported subagent", () => {
  it("a subagent on another model or effort gets pair_mismatch naming the role's pair and saying close it and spawn again; the step stays; the right pair binds (S000-059)", async () => {
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
    expect(reply.reason).toContain("close it and spawn again");
    expect(await run.steps()).toHaveLength(1); // the step stays
    // the right model on another effort is another pair too
    const lowEffort = run.spawn(step, "explorer", { model: "m-explore", reasoningEffort: "low" });
    expect(await run.report(step, lowEffort.threadId)).toBe("pair_mismatch");
    expect(await run.steps()).toHaveLength(1);
    const right = run.spawn(step, "explorer", { model: "m-explore", reasoningEffort: "high" });
    expect(await run.report(step, right.threadId)).toBe("bound");
    run.fake.answer(right.threadId, '{"n":1}', { input: 1, output: 1 });
    expect(await done).toEqual({ state: "completed", result: { n: 1 } });
    const ts = run.rows().find((r) => r.type === "thread_started");
    expect(ts).toMatchObject({ thread_id: right.threadId, model: "m-explore", effort: "high" });
    expect(ts).not.toHaveProperty("pair_unchecked");
    expect(ts).not.toHaveProperty("effort_unchecked");
  });

  it("only the owner's subagent whose turn opens with the marker and that runs the role's pair is bound (S000-057)", async () => {
    run = await inProcessRun({ roles: { explorer: { model: "m-explore", effort: "high" } } });
    const r = run;
    const { done } = r.background(one());
    const step = await r.firstStep();
    const pair = { model: "m-explore", reasoningEffort: "high", agentRole: "explorer" };
    const threads = () => r.rows().filter((x) => x.type === "thread_started");
    // each of the three lacks exactly one of the conditions
    const stranger = r.fake.createOwnerThread();
    r.fake.startOwnerTurn(stranger);
    const foreign = r.fake.spawnSubagent({ ownerThreadId: stranger, message: step.message, ...pair });
    expect(await r.report(step, foreign.threadId)).toBe("refused");
    const unmarked = r.fake.spawnSubagent({
      ownerThreadId: r.owner,
      message: `read this first\n${step.message}`,
      ...pair,
    });
    expect(await r.report(step, unmarked.threadId)).toBe("retry");
    const otherPair = r.spawn(step, "explorer", { model: "m-explore", reasoningEffort: "low" });
    expect(await r.report(step, otherPair.threadId)).toBe("pair_mismatch");
    expect(threads()).toHaveLength(0);
    expect(await r.steps()).toHaveLength(1);
    const right = r.spawn(step, "explorer", pair);
    expect(await r.report(step, right.threadId)).toBe("bound");
    r.fake.answer(right.threadId, '{"n":1}');
    expect(await done).toEqual({ state: "completed", result: { n: 1 } });
    expect(threads()).toEqual([
      expect.objectContaining({
        thread_id: right.threadId,
        parent_thread_id: r.owner,
        model: "m-explore",
        effort: "high",
      }),
    ]);
  });

  it("crw flow dispatched prints a pair_mismatch reply with the role's pair and exits 1 (S000-230)", async () => {
    run = await inProcessRun({ roles: { explorer: { model: "m-explore", effort: "high" } } });
    run.background(one());
    const step = await run.firstStep();
    // The run goes on in this process: it holds the run's lock as a run's own process does.
    const lock = run.paths.runLock;
    expect(tryLock(lock)).toBe(true);
    onTestFinished(() => unlock(lock));
    const wrong = run.spawn(step, "explorer", { model: "other", reasoningEffort: "high" });
    const d = await crwFlow(
      dispatchedArgs(run.spec.run_id, step, wrong.threadId, run.paths.state, ["--wait", "20"]),
    );
    expect(d.code, d.stderr).toBe(1);
    expect(d.json()).toMatchObject({ reply: "pair_mismatch", pair: { model: "m-explore", effort: "high" } });
    // the right pair binds, and that reply exits 0
    const right = run.spawn(step, "explorer", { model: "m-explore", reasoningEffort: "high" });
    const bound = await crwFlow(dispatchedArgs(run.spec.run_id, step, right.threadId, run.paths.state));
    expect(bound.code, bound.stderr).toBe(0);
    expect(bound.json()).toMatchObject({ reply: "bound" });
  });

  it("a model with an undecided effort binds on the model alone: another model is still a pair_mismatch; the host's effort is recorded with effort_unchecked (S000-069)", async () => {
    run = await inProcessRun({ roles: { explorer: { model: "m-explore" } } });
    const { done } = run.background(one());
    const step = await run.firstStep();
    const otherModel = run.spawn(step, "explorer", { model: "other", reasoningEffort: "low" });
    expect(await run.report(step, otherModel.threadId)).toBe("pair_mismatch");
    const a = run.spawn(step, "explorer", { model: "m-explore", reasoningEffort: "low" });
    expect(await run.report(step, a.threadId)).toBe("bound");
    run.fake.answer(a.threadId, '{"n":2}');
    await done;
    const ts = run.rows().find((r) => r.type === "thread_started");
    expect(ts).toMatchObject({
      thread_id: a.threadId,
      model: "m-explore",
      effort: "low",
      effort_unchecked: true,
    });
    expect(ts).not.toHaveProperty("pair_unchecked");
  });

  it("a role whose pair the role table leaves to the host binds a subagent on any pair, recorded pair_unchecked with the host's pair (S000-067)", async () => {
    run = await inProcessRun();
    const { done } = run.background(one());
    const step = await run.firstStep();
    const a = run.spawn(step, "explorer", { model: "host-model", reasoningEffort: "minimal" });
    expect(await run.report(step, a.threadId)).toBe("bound");
    run.fake.answer(a.threadId, '{"n":2}');
    await done;
    const ts = run.rows().find((r) => r.type === "thread_started");
    expect(ts).toMatchObject({
      thread_id: a.threadId,
      model: "host-model",
      effort: "minimal",
      pair_unchecked: true,
    });
    expect(ts).not.toHaveProperty("effort_unchecked");
  });

  it("an agentRole other than the expected agent type is recorded session_agent_role_mismatch and bound (S000-068)", async () => {
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

  describe("replies that bind nothing", () => {
    /** Starts the one-call run and returns its step; `finish` binds a right subagent and ends the run. */
    async function started() {
      run = await inProcessRun();
      const r = run;
      const { done } = r.background(one());
      const step = await r.firstStep();
      const threads = () => r.rows().filter((x) => x.type === "thread_started");
      const finish = async (n: number) => {
        const a = r.spawn(step, "explorer");
        expect(await r.report(step, a.threadId)).toBe("bound");
        r.fake.answer(a.threadId, `{"n":${n}}`);
        expect(await done).toEqual({ state: "completed", result: { n } });
        return a.threadId;
      };
      return { r, step, threads, finish, done };
    }

    it("a reported subagent with no turn carrying the step's marker yet is told to retry, and nothing is bound (S000-060)", async () => {
      const { r, threads, step, finish } = await started();
      const noMarker = r.fake.spawnSubagent({
        ownerThreadId: r.owner,
        message: "hello",
        agentRole: "explorer",
      });
      expect(await r.report(step, noMarker.threadId)).toBe("retry");
      expect(threads()).toHaveLength(0);
      expect(await r.steps()).toHaveLength(1);
      const bound = await finish(4);
      expect(threads().map((t) => (t as { thread_id: string }).thread_id)).toEqual([bound]);
    });

    it("a report read while the host cannot be reached is told to retry, and binds once the host answers (S000-060)", async () => {
      const { r, threads, step, done } = await started();
      const a = r.spawn(step, "explorer");
      await r.fake.setUnreachable();
      try {
        expect(await r.report(step, a.threadId)).toBe("retry");
        expect(threads()).toHaveLength(0);
      } finally {
        await r.fake.setReachable();
      }
      expect(await r.report(step, a.threadId)).toBe("bound");
      r.fake.answer(a.threadId, '{"n":5}');
      expect(await done).toEqual({ state: "completed", result: { n: 5 } });
      expect(threads().map((t) => (t as { thread_id: string }).thread_id)).toEqual([a.threadId]);
    });

    it("a report that names another run is refused, and nothing is bound (S000-061)", async () => {
      const { r, threads, step, finish } = await started();
      const a = r.spawn(step, "explorer");
      expect(await r.report(step, a.threadId, "another-run")).toBe("refused");
      // so is one naming a step no call waits for: another run's report is never read as this run's
      expect(await r.report({ call: step.call, k: 5, attempt: 1 }, a.threadId, "another-run")).toBe(
        "refused",
      );
      expect(threads()).toHaveLength(0);
      await finish(6);
    });

    it("a reported agent that is not a subagent of the owner thread is refused, though it carries the step's marker (S000-063)", async () => {
      const { r, threads, step, finish } = await started();
      const stranger = r.fake.createOwnerThread();
      r.fake.startOwnerTurn(stranger);
      const foreign = r.fake.spawnSubagent({
        ownerThreadId: stranger,
        message: step.message,
        agentRole: "explorer",
      });
      expect(await r.report(step, foreign.threadId)).toBe("refused");
      expect(threads()).toHaveLength(0);
      const bound = await finish(7);
      expect(bound).not.toBe(foreign.threadId);
    });

    it("a report naming a step the run did not publish is told to close, and nothing is bound (S000-065)", async () => {
      const { r, threads, step, finish } = await started();
      const a = r.spawn(step, "explorer");
      expect(await r.report({ call: step.call, k: 5, attempt: 1 }, a.threadId)).toBe("close");
      expect(threads()).toHaveLength(0);
      await finish(8);
    });

    it("a second subagent reported for an attempt already bound is told to close; the first stays the bound one (S000-066)", async () => {
      run = await inProcessRun();
      const { done } = run.background(one());
      const step = await run.firstStep();
      const a = run.spawn(step, "explorer");
      expect(await run.report(step, a.threadId)).toBe("bound");
      const second = run.spawn(step, "explorer");
      expect(await run.report(step, second.threadId)).toBe("close");
      run.fake.answer(a.threadId, '{"n":4}');
      expect(await done).toEqual({ state: "completed", result: { n: 4 } });
      const threads = run.rows().filter((x) => x.type === "thread_started");
      expect(threads.map((t) => (t as { thread_id: string }).thread_id)).toEqual([a.threadId]);
    });
  });

  it("a report for an attempt that was lost is told to close, even from the subagent that was bound to it (S000-064)", async () => {
    run = await inProcessRun({ lostAfterMs: 60_000 });
    const r = run;
    const { done } = r.background(one());
    const s1 = await r.firstStep();
    const a = r.spawn(s1, "explorer");
    expect(await r.report(s1, a.threadId)).toBe("bound");
    // a turn interrupted without an error on an unloaded thread loses the attempt at once
    r.fake.interruptTurn(a.threadId);
    r.fake.setThreadStatus(a.threadId, "notLoaded");
    await until("the lost row", () => r.rows().some((x) => x.type === "session_attempt_lost"));
    expect(await r.report(s1, a.threadId)).toBe("close");
    let s2: Awaited<ReturnType<typeof r.firstStep>> | undefined;
    await until("the second attempt's step", () => {
      s2 = listStepFiles(r.paths.steps).steps.find((s) => s.attempt === 2);
      return s2 !== undefined;
    });
    if (!s2) throw new Error("no second attempt's step");
    const b = r.spawn(s2, "explorer");
    expect(await r.report(s2, b.threadId)).toBe("bound");
    r.fake.answer(b.threadId, '{"n":9}');
    expect(await done).toEqual({ state: "completed", result: { n: 9 } });
  });

  it("a report for an attempt that was answered is told to close (S000-064)", async () => {
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
