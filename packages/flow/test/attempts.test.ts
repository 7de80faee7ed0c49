import { readFileSync } from "node:fs";
import { executeRun, FlowError } from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import {
  defineWorkflow,
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

const one = (role: "explorer" | "executor" = "explorer", task = "count") =>
  defineWorkflow({ name: "one", run: (ctx) => ctx.call({ role, task, schema }) });

describe("attempts, holds and pauses", () => {
  it("S000-126 S000-128 S000-131 S000-132 S000-133 S000-134 S000-135: a subagent that is notLoaded and unchanged for LostAfter loses the attempt; the next spawns in the same allocation", async () => {
    run = await inProcessRun({ lostAfterMs: 300 });
    const { done } = run.background(one("executor"));
    const s1 = await run.firstStep();
    const a = run.spawn(s1, "executor");
    expect(await run.report(s1, a.threadId)).toBe("bound");
    run.fake.setThreadStatus(a.threadId, "notLoaded"); // the turn stays inProgress and never changes
    await until("attempt 2's step", () => rowsOfType(run?.rows() ?? [], "step_published").length === 2);
    const rows = run.rows();
    const lost = rowsOfType(rows, "session_attempt_lost")[0];
    expect(lost).toMatchObject({
      attempt: 1,
      agent_id: a.threadId,
      k: 1,
      turn_id: a.turnId,
      host_status: "notLoaded",
      turn_status: "inProgress",
    });
    const s2row = rowsOfType(rows, "step_published")[1];
    expect(s2row).toMatchObject({
      k: 1,
      attempt: 2,
      action: "spawn",
      marker: "executor.1/t1-a2",
      workspace: s1.workspace,
    });
    const steps = await run.steps();
    const s2 = steps.find((s) => s.attempt === 2);
    if (!s2) throw new Error("no attempt 2 step");
    const packet = readFileSync(s2.packet, "utf8");
    expect(packet).toContain("The previous attempt (1) was cut off");
    expect(packet).toContain(`git -C ${s1.workspace} status`);
    const b = run.spawn(s2, "executor");
    expect(await run.report(s2, b.threadId)).toBe("bound");
    run.fake.answer(b.threadId, '{"n":9}');
    expect(await done).toEqual({ state: "completed", result: { n: 9 } });
    expect(rowsOfType(run.rows(), "prepared")).toHaveLength(1); // one allocation for every attempt
    // the old subagent got a close step (S000-132)
    expect(
      rowsOfType(run.rows(), "thread_started").map((r) => (r as { thread_id: string }).thread_id),
    ).toEqual([a.threadId, b.threadId]);
  });

  it("S000-130 S000-129: an active thread is waited for, and a host that cannot be asked judges nothing", async () => {
    run = await inProcessRun({ lostAfterMs: 200 });
    const { done } = run.background(one());
    const s1 = await run.firstStep();
    const a = run.spawn(s1, "explorer");
    expect(await run.report(s1, a.threadId)).toBe("bound");
    run.fake.setThreadStatus(a.threadId, "active");
    await new Promise((r) => setTimeout(r, 600));
    await run.fake.setUnreachable();
    await new Promise((r) => setTimeout(r, 600));
    await run.fake.setReachable();
    run.fake.answer(a.threadId, '{"n":1}');
    expect(await done).toEqual({ state: "completed", result: { n: 1 } });
    expect(rowsOfType(run.rows(), "session_attempt_lost")).toHaveLength(0);
  });

  it("S000-092 S000-089 S000-149 S000-150 S000-233: a host failure holds the call and pauses the run; the resume goes on in place with a new attempt", async () => {
    run = await inProcessRun();
    const { done } = run.background(one());
    const s1 = await run.firstStep();
    const a = run.spawn(s1, "explorer");
    expect(await run.report(s1, a.threadId)).toBe("bound");
    run.fake.failTurn(a.threadId, "internalServerError", { message: "boom" });
    expect(await done).toEqual({ state: "paused", reason: "held:explorer.1" });
    const held = rowsOfType(run.rows(), "held")[0];
    expect(held).toMatchObject({
      call: "explorer.1",
      reason: "host_failure",
      detail: expect.stringContaining("internalServerError"),
    });
    // resume: a new process (same journal) goes on with the held call in place
    const second = run.background(one());
    await until("the new attempt's step", () => rowsOfType(run?.rows() ?? [], "step_published").length === 2);
    const s2 = (await run.steps()).find((s) => s.attempt === 2);
    if (!s2) throw new Error("no new attempt");
    expect(s2).toMatchObject({ k: 2, action: "spawn" });
    expect(readFileSync(s2.packet, "utf8")).toContain("was stopped: host_failure");
    const b = run.spawn(s2, "explorer");
    expect(await run.report(s2, b.threadId)).toBe("bound");
    run.fake.answer(b.threadId, '{"n":5}');
    expect(await second.done).toEqual({ state: "completed", result: { n: 5 } });
    expect(rowsOfType(run.rows(), "started")).toHaveLength(2);
  });

  it("S000-090 S000-102 S000-103 S000-107 S000-108 S000-168 S000-104 S000-106: a usage limit pauses the run: running turns are interrupted (the row first), waiting steps retracted", async () => {
    run = await inProcessRun();
    const wf = defineWorkflow({
      name: "three",
      run: (ctx) =>
        Promise.all([
          ctx.call({ role: "explorer", task: "a", schema }),
          ctx.call({ role: "reviewer", task: "b", schema }),
          ctx.call({ role: "critic", task: "c", schema }),
        ]),
    });
    const { done } = run.background(wf);
    const steps = await run.steps(3);
    const byCall = new Map(steps.map((s) => [s.call, s]));
    const ex = byCall.get("explorer.1");
    const rv = byCall.get("reviewer.1");
    if (!ex || !rv) throw new Error("steps");
    const a = run.spawn(ex, "explorer");
    const b = run.spawn(rv, "reviewer");
    expect(await run.report(ex, a.threadId)).toBe("bound");
    expect(await run.report(rv, b.threadId)).toBe("bound");
    run.fake.failTurn(a.threadId, "usageLimitExceeded");
    expect(await done).toEqual({ state: "paused", reason: "usage_limit" });
    const rows = run.rows();
    const ir = rowsOfType(rows, "interrupt_requested")[0];
    expect(ir).toMatchObject({
      call: "reviewer.1",
      op: "reviewer.1/t1",
      reason: "usage_limit",
      turn_id: b.turnId,
    });
    expect(run.fake.state.turn(b.threadId, b.turnId).status).toBe("interrupted");
    const heldB = rows.find((r) => r.type === "held" && r.call === "reviewer.1");
    expect(heldB && ir && heldB.seq > ir.seq).toBe(true);
    expect(rows.find((r) => r.type === "held" && r.call === "critic.1")).toBeTruthy();
    expect(rows.some((r) => r.type === "interrupt_requested" && r.call === "critic.1")).toBe(false);
    expect((await run.steps(0)).filter((s) => s.call === "critic.1")).toHaveLength(0); // retracted
    expect(rowsOfType(rows, "run_paused")[0]).toMatchObject({ reason: "usage_limit" });
  });

  it("S000-029 S000-030 S000-031 S000-032 S000-033 S000-177: a step that cannot be written is warned at the 1st and 10th failure, written again at the poll, then closed", async () => {
    run = await inProcessRun({ pollMs: 5 });
    let failures = 0;
    const hook = (path: string) => {
      if (path.endsWith(".json") && failures < 12) {
        failures++;
        throw new Error("ENOSPC: no space left on device");
      }
    };
    const done = executeRun({
      paths: run.paths,
      spec: run.spec,
      host: run.host,
      processToken: null,
      workflow: one(),
      stepWriteHook: hook,
    });
    const s1 = await run.firstStep();
    const rows = rowsOfType(run.rows(), "step_unwritten");
    expect(rows.map((r) => (r as { failures: number }).failures)).toEqual([1, 10, 12]);
    expect(rows[0]).toMatchObject({
      marker: "explorer.1/t1-a1",
      k: 1,
      attempt: 1,
      action: "spawn",
      input_state: "not_delivered",
      error: expect.stringContaining("ENOSPC"),
    });
    expect(rows[2]).toMatchObject({ written: true });
    expect(rows[0]).not.toHaveProperty("written");
    const a = run.spawn(s1, "explorer");
    expect(await run.report(s1, a.threadId)).toBe("bound");
    run.fake.answer(a.threadId, '{"n":1}');
    expect(await done).toMatchObject({ state: "completed" });
  });

  it("a resume whose workflow changed a call's input is refused naming the op (exit 2)", async () => {
    run = await inProcessRun();
    const { done } = run.background(one());
    const s1 = await run.firstStep();
    const a = run.spawn(s1, "explorer");
    await run.report(s1, a.threadId);
    run.fake.failTurn(a.threadId, "internalServerError");
    await done;
    const before = run.rows().length;
    const changed = run.background(one("explorer", "count differently"));
    const err = await changed.done.catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FlowError);
    expect((err as FlowError).code).toBe("digest_mismatch");
    expect((err as FlowError).exitCode).toBe(2);
    expect((err as FlowError).message).toContain("explorer.1");
    // only the resumed process's started row was added; nothing of the call
    expect(
      run
        .rows()
        .slice(before)
        .map((r) => r.type),
    ).toEqual(["started"]);
  });
});
