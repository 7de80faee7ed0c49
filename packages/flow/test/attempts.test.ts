import { readFileSync, rmSync } from "node:fs";
import {
  executeRun,
  FlowError,
  type JournalRow,
  listStepFiles,
  readJournalFile,
  spawnMessage,
  writeCancelRequest,
} from "@crw/flow";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
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

const one = (role: "explorer" | "executor" = "explorer", task = "count") =>
  defineWorkflow({ name: "one", run: (ctx) => ctx.call({ role, task, schema }) });

describe("attempts, holds and pauses", () => {
  it("an active thread is waited for, and a host that cannot be asked judges nothing (S000-130 S000-129)", async () => {
    run = await inProcessRun({ lostAfterMs: 200 });
    const { done } = run.background(one());
    const s1 = await run.firstStep();
    const a = run.spawn(s1, "explorer");
    expect(await run.report(s1, a.threadId)).toBe("bound");
    run.fake.setThreadStatus(a.threadId, "active");
    // three times LostAfter with the turn unchanged: an active thread is still only waited for
    await new Promise((r) => setTimeout(r, 600));
    expect(lostRows(run), "an active thread was judged lost").toEqual([]);
    await run.fake.setUnreachable();
    await new Promise((r) => setTimeout(r, 600));
    expect(lostRows(run), "a thread the host could not be asked about was judged lost").toEqual([]);
    await run.fake.setReachable();
    run.fake.answer(a.threadId, '{"n":1}');
    expect(await done).toEqual({ state: "completed", result: { n: 1 } });
    expect(rowsOfType(run.rows(), "session_attempt_lost")).toHaveLength(0);
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

describe("a usage or rate limit pauses the run", () => {
  it.each(["usageLimitExceeded", "rateLimitExceeded"])(
    "a turn failed with %s holds its call for usage_limit and pauses the run (S000-090)",
    async (code) => {
      run = await inProcessRun();
      const { done } = run.background(one());
      const s1 = await run.firstStep();
      const a = run.spawn(s1, "explorer");
      expect(await run.report(s1, a.threadId)).toBe("bound");
      run.fake.failTurn(a.threadId, code);
      expect(await done).toEqual({ state: "paused", reason: "usage_limit" });
      const rows = run.rows();
      expect(rowsOfType(rows, "held")[0]).toMatchObject({ call: "explorer.1", reason: "usage_limit" });
      expect(rowsOfType(rows, "run_paused")[0]).toMatchObject({ reason: "usage_limit" });
    },
  );
});

/**
 * Three calls: the explorer's and the reviewer's turns run, the critic's step waits for the owner. The
 * explorer's turn fails on the usage limit; the host ends an interrupted turn 400 ms after it answered
 * the interrupt, as the real server does some time later.
 */
describe("a pause stops the calls still going", () => {
  let r: InProcessRun;
  let rows: JournalRow[];
  let outcome: unknown;
  let reviewer: { threadId: string; turnId: string };
  let criticStep: { call: string; marker: string } | undefined;
  /** What the journal file held when the host received the interrupt. */
  let onDiskAtInterrupt: JournalRow[] = [];
  const interrupts: Array<{ threadId: string; turnId: string }> = [];

  beforeAll(async () => {
    r = await inProcessRun();
    r.fake.setInterruptDelay(400);
    r.fake.onRequest((method, params) => {
      if (method !== "turn/interrupt") return;
      const p = params as { threadId: string; turnId: string };
      interrupts.push({ threadId: p.threadId, turnId: p.turnId });
      onDiskAtInterrupt = readJournalFile(r.paths.journal).rows;
    });
    const wf = defineWorkflow({
      name: "three",
      run: (ctx) =>
        Promise.all([
          ctx.call({ role: "explorer", task: "a", schema }),
          ctx.call({ role: "reviewer", task: "b", schema }),
          ctx.call({ role: "critic", task: "c", schema }),
        ]),
    });
    const { done } = r.background(wf);
    const steps = await r.steps(3);
    const byCall = new Map(steps.map((s) => [s.call, s]));
    const ex = byCall.get("explorer.1");
    const rv = byCall.get("reviewer.1");
    criticStep = byCall.get("critic.1");
    if (!ex || !rv) throw new Error("steps");
    const a = r.spawn(ex, "explorer");
    reviewer = r.spawn(rv, "reviewer");
    expect(await r.report(ex, a.threadId)).toBe("bound");
    expect(await r.report(rv, reviewer.threadId)).toBe("bound");
    r.fake.failTurn(a.threadId, "usageLimitExceeded");
    outcome = await done;
    rows = r.rows();
  });
  afterAll(() => r?.close());

  const interruptRow = () => rowsOfType(rows, "interrupt_requested")[0];
  const heldOf = (call: string) => rows.find((x) => x.type === "held" && x.call === call);

  it("a pause interrupts the reviewer's running turn and the run pauses (S000-102)", () => {
    expect(outcome).toEqual({ state: "paused", reason: "usage_limit" });
    expect(r.fake.state.turn(reviewer.threadId, reviewer.turnId).status).toBe("interrupted");
    expect(rowsOfType(rows, "run_paused")[0]).toMatchObject({ reason: "usage_limit" });
  });

  it("the call is held only once the interrupted thread reads inactive, not when the interrupt is answered (S000-103)", () => {
    const ended = r.fake.interruptsEnded.find((e) => e.turnId === reviewer.turnId);
    expect(ended).toBeDefined();
    const held = heldOf("reviewer.1");
    expect(held).toBeDefined();
    expect(Date.parse(held?.at as string)).toBeGreaterThanOrEqual((ended?.at ?? 0) - 5);
    expect(Date.parse(held?.at as string) - Date.parse(interruptRow()?.at as string)).toBeGreaterThanOrEqual(
      350,
    );
  });

  it("the rows before an interrupt, the turn's turn_started among them, are on disk when the host receives it (S000-107)", () => {
    const types = onDiskAtInterrupt.filter((x) => "call" in x && x.call === "reviewer.1").map((x) => x.type);
    expect(types).toEqual([
      "prepared",
      "step_published",
      "thread_started",
      "turn_started",
      "interrupt_requested",
    ]);
  });

  it("the interrupt is sent for the turn in flight: the reviewer's thread and turn (S000-108)", () => {
    expect(interrupts).toEqual([{ threadId: reviewer.threadId, turnId: reviewer.turnId }]);
  });

  it("interrupt_requested records the interrupt of the turn in flight with its reason and op (S000-168)", () => {
    expect(interruptRow()).toMatchObject({
      call: "reviewer.1",
      op: "reviewer.1/t1",
      reason: "usage_limit",
      k: 1,
      attempt: 1,
      turn_id: reviewer.turnId,
    });
    expect(rowsOfType(rows, "interrupt_requested")).toHaveLength(1);
    // the interrupt row comes before the reviewer's held row
    expect((heldOf("reviewer.1")?.seq ?? 0) > (interruptRow()?.seq ?? 0)).toBe(true);
  });

  it("a call whose step waited for a dispatch has its step retracted and is held (S000-104)", async () => {
    expect(criticStep).toBeDefined();
    expect((await r.steps(0)).filter((s) => s.call === "critic.1")).toHaveLength(0);
    expect(heldOf("critic.1")).toMatchObject({ reason: "usage_limit" });
  });

  it("a spawn step with no bound subagent has no turn to interrupt: nothing is sent or written for it (S000-106)", () => {
    expect(rows.some((x) => x.type === "interrupt_requested" && x.call === "critic.1")).toBe(false);
    expect(interrupts.map((i) => i.threadId)).toEqual([reviewer.threadId]);
    expect(rows.some((x) => x.type === "turn_started" && x.call === "critic.1")).toBe(false);
  });
});

/** A bound subagent of a one-call run, for the tests of a lost attempt. */
async function boundRun(options: { lostAfterMs: number; pollMs?: number; role?: "explorer" | "executor" }) {
  const r = await inProcessRun(options);
  const { done } = r.background(one(options.role ?? "explorer"));
  const step = await r.firstStep();
  const agent = r.spawn(step, options.role ?? "explorer");
  expect(await r.report(step, agent.threadId)).toBe("bound");
  return { r, done, step, agent };
}

const lostRows = (r: InProcessRun) => rowsOfType(r.rows(), "session_attempt_lost");

describe("an attempt is lost only when its turn is not completed and its thread is gone", () => {
  it.each(["notLoaded", "systemError"] as const)(
    "a subagent whose thread reads %s and whose turn is unchanged for LostAfter loses its attempt (S000-126)",
    async (status) => {
      const b = await boundRun({ lostAfterMs: 300 });
      run = b.r;
      const changedAt = Date.now();
      run.fake.setThreadStatus(b.agent.threadId, status);
      await until("the lost row", () => lostRows(b.r).length === 1);
      expect(lostRows(run)[0]).toMatchObject({ host_status: status, turn_status: "inProgress" });
      // not at once: the thread had to read so for LostAfter first
      expect(Date.parse(lostRows(run)[0]?.at ?? "")).toBeGreaterThanOrEqual(changedAt + 300);
    },
  );

  it("a subagent the host no longer knows reads as unknown and loses its attempt after LostAfter (S000-126)", async () => {
    const b = await boundRun({ lostAfterMs: 300 });
    run = b.r;
    const goneAt = Date.now();
    run.fake.state.threads.delete(b.agent.threadId);
    await until("the lost row", () => lostRows(b.r).length === 1);
    expect(lostRows(run)[0]).toMatchObject({ host_status: "unknown", turn_status: null });
    expect(Date.parse(lostRows(run)[0]?.at ?? "")).toBeGreaterThanOrEqual(goneAt + 300);
  });

  it.each(["interrupted", "failed"] as const)(
    "a turn that ended %s without an error on an unloaded thread is lost at once, before LostAfter (S000-126)",
    async (ended) => {
      const b = await boundRun({ lostAfterMs: 60_000 });
      run = b.r;
      if (ended === "interrupted") run.fake.interruptTurn(b.agent.threadId);
      // the fake fails a turn only with an error; a host may show a failed turn with none
      else run.fake.state.turn(b.agent.threadId, b.agent.turnId).status = "failed";
      run.fake.setThreadStatus(b.agent.threadId, "notLoaded");
      await until("the lost row", () => lostRows(b.r).length === 1, 5_000);
      expect(lostRows(run)[0]).toMatchObject({ host_status: "notLoaded", turn_status: ended });
    },
  );

  it("a completed marker turn is harvested, never lost, on a thread that reads notLoaded (S000-126)", async () => {
    const b = await boundRun({ lostAfterMs: 200 });
    run = b.r;
    // the turn completes and then the thread unloads, while the run cannot look: its next read sees both
    await run.fake.setUnreachable();
    run.fake.answer(b.agent.threadId, '{"n":4}');
    run.fake.setThreadStatus(b.agent.threadId, "notLoaded");
    await run.fake.setReachable();
    const r = run;
    await until("the call's end", () =>
      r.rows().some((x) => x.type === "completed" || x.type === "session_attempt_lost"),
    );
    expect(lostRows(run)).toEqual([]);
    expect(await b.done).toEqual({ state: "completed", result: { n: 4 } });
  });

  it("the thread is read once more right before an attempt is judged lost (S000-128)", async () => {
    const reads: Array<{ at: number; lostOnDisk: boolean }> = [];
    const b = await boundRun({ lostAfterMs: 600, pollMs: 250 });
    run = b.r;
    const r = b.r;
    r.fake.onRequest((method, params) => {
      if (method !== "thread/read" || (params as { threadId?: string }).threadId !== b.agent.threadId) return;
      const lostOnDisk = readJournalFile(r.paths.journal).rows.some((x) => x.type === "session_attempt_lost");
      reads.push({ at: performance.now(), lostOnDisk });
    });
    const statusSetAt = performance.now();
    r.fake.setThreadStatus(b.agent.threadId, "notLoaded");
    await until("the lost row", () => lostRows(r).length === 1);
    // The reads from the status change on: the change's notification ends the nap at once, so the first gap
    // may be a read in flight and the one the notification woke; the rest are the run's own rounds.
    const before = reads.filter((x) => !x.lostOnDisk && x.at >= statusSetAt);
    expect(before.length).toBeGreaterThanOrEqual(4);
    const gaps = before.slice(1).map((x, i) => x.at - (before[i]?.at ?? 0));
    // the rounds are a poll apart; the read that judged the loss came right after the one that ran the clock
    // out: not a poll later (judged against the run's own rounds, so a loaded machine slows both alike)
    const rounds = gaps.slice(1, -1);
    expect(Math.min(...rounds)).toBeGreaterThan(150);
    expect(gaps.at(-1)).toBeLessThan(Math.min(...rounds) / 2);
  });
});

describe("the read before a loss", () => {
  it("a thread that is back by the read right before the judgment keeps its attempt (S000-128)", async () => {
    const b = await boundRun({ lostAfterMs: 400, pollMs: 100 });
    run = b.r;
    const r = b.r;
    // the reads of the subagent from its unloading on: once one comes LostAfter after the first, the host
    // shows the thread back (active) to the next read, the one the run makes before judging
    let since: number | null = null;
    let previous: number | null = null;
    let back = false;
    let armed = false;
    r.fake.onRequest((method, params) => {
      if (!armed || back || method !== "thread/read") return;
      if ((params as { threadId?: string }).threadId !== b.agent.threadId) return;
      const now = Date.now();
      since ??= now;
      if (previous !== null && previous - since >= 400 - 5) {
        r.fake.setThreadStatus(b.agent.threadId, "active");
        back = true;
      }
      previous = now;
    });
    armed = true;
    r.fake.setThreadStatus(b.agent.threadId, "notLoaded");
    await until("the thread to be back, or the attempt lost", () => back || lostRows(r).length > 0, 5_000);
    expect(lostRows(r), "lost on the read that ran the clock out").toEqual([]);
    await new Promise((x) => setTimeout(x, 500)); // longer than LostAfter: nothing judges it now
    expect(lostRows(r)).toEqual([]);
    r.fake.answer(b.agent.threadId, '{"n":6}');
    expect(await b.done).toEqual({ state: "completed", result: { n: 6 } });
  });
});

/**
 * An executor's bound subagent whose thread reads notLoaded with its turn unchanged for LostAfter; the
 * test plays the owner for the second attempt.
 */
describe("after a lost attempt", () => {
  let r: InProcessRun;
  let first: { threadId: string; turnId: string };
  let second: { threadId: string };
  let firstWorkspace: string;
  let packet: string;
  let closesAtSecond: string[] = [];
  let outcome: unknown;

  beforeAll(async () => {
    const b = await boundRun({ lostAfterMs: 300, role: "executor" });
    r = b.r;
    first = b.agent;
    firstWorkspace = b.step.workspace;
    r.fake.setThreadStatus(first.threadId, "notLoaded"); // the turn stays inProgress and never changes
    await until("attempt 2's step", () => rowsOfType(r.rows(), "step_published").length === 2);
    const s2 = (await r.steps()).find((s) => s.attempt === 2);
    if (!s2) throw new Error("no attempt 2 step");
    packet = readFileSync(s2.packet, "utf8");
    closesAtSecond = listStepFiles(r.paths.steps).closes.map((c) => c.agent_id);
    second = r.spawn(s2, "executor");
    expect(await r.report(s2, second.threadId)).toBe("bound");
    r.fake.answer(second.threadId, '{"n":9}');
    outcome = await b.done;
  });
  afterAll(() => r?.close());

  it("the loss is a session_attempt_lost row naming the attempt, subagent, turn, reason and what the host showed (S000-131)", () => {
    expect(outcome).toEqual({ state: "completed", result: { n: 9 } });
    expect(rowsOfType(r.rows(), "session_attempt_lost")).toEqual([
      expect.objectContaining({
        attempt: 1,
        agent_id: first.threadId,
        k: 1,
        turn_id: first.turnId,
        reason: expect.stringContaining("no change for 300 ms"),
        host_status: "notLoaded",
        turn_status: "inProgress",
      }),
    ]);
  });

  it("the old subagent is closed and the next attempt spawns a new one in the same allocation (S000-132 S000-026)", () => {
    expect(closesAtSecond).toContain(first.threadId);
    const attempt2 = rowsOfType(r.rows(), "step_published")[1];
    expect(attempt2).toMatchObject({ k: 1, attempt: 2, action: "spawn", workspace: firstWorkspace });
    expect(rowsOfType(r.rows(), "thread_started").map((x) => (x as { thread_id: string }).thread_id)).toEqual(
      [first.threadId, second.threadId],
    );
  });

  it("the next attempt's step row carries the note about the attempt before it (S000-018)", () => {
    expect(rowsOfType(r.rows(), "step_published")[1]).toMatchObject({
      attempt: 2,
      note: expect.stringContaining("The previous attempt (1) was cut off"),
    });
  });

  it("a later attempt bound on the pair the earlier one ran records no prior_pairs (S000-077)", () => {
    const threads = rowsOfType(r.rows(), "thread_started");
    expect(threads).toHaveLength(2);
    expect(threads[1]).not.toHaveProperty("prior_pairs");
  });

  it("the next attempt's packet says the previous one was cut off (S000-133)", () => {
    expect(packet).toContain("The previous attempt (1) was cut off");
  });

  it("an executor's next attempt is told to read git status and the diff of its workspace first (S000-134)", () => {
    expect(packet).toContain(`Read git -C ${firstWorkspace} status and the diff first`);
  });

  it("one allocation serves every attempt: one prepared row, one workspace (S000-135)", () => {
    const prepared = rowsOfType(r.rows(), "prepared") as Array<Extract<JournalRow, { type: "prepared" }>>;
    expect(prepared).toHaveLength(1);
    const workspaces = rowsOfType(r.rows(), "step_published").map(
      (x) => (x as { workspace: string }).workspace,
    );
    expect(new Set([prepared[0]?.allocation.workspace, ...workspaces])).toEqual(new Set([firstWorkspace]));
  });
});

describe("a run cancelled after a lost attempt", () => {
  it("the lost subagent's close is handed out once, with the next attempt's step: the cancel hands out no other", async () => {
    const b = await boundRun({ lostAfterMs: 60_000 });
    run = b.r;
    const r = run;
    // a turn failed without an error on an unloaded thread: lost at once
    r.fake.state.turn(b.agent.threadId, b.agent.turnId).status = "failed";
    r.fake.setThreadStatus(b.agent.threadId, "notLoaded");
    await until("attempt 2's step", () => listStepFiles(r.paths.steps).steps.some((s) => s.attempt === 2));
    const closes = listStepFiles(r.paths.steps).closes;
    expect(closes.map((c) => c.agent_id)).toEqual([b.agent.threadId]);
    // the owner takes the close as crw flow next does; the run is cancelled before attempt 2 is spawned
    for (const c of closes) rmSync(c.path);
    writeCancelRequest(r.paths, "wrong branch");
    expect(await b.done).toEqual({ state: "cancelled", reason: "wrong branch" });
    expect(listStepFiles(r.paths.steps)).toMatchObject({ steps: [], closes: [] });
  });

  it("a run cancelled before the next attempt's step was published hands out the lost subagent's close", async () => {
    run = await inProcessRun();
    const r = run;
    const a = diedAfter(r, "lost");
    // the subagent's turn ended without an error on a thread the host still holds: it is still there
    r.fake.state.turn(a.threadId, a.turnId).status = "failed";
    writeCancelRequest(r.paths, "wrong branch");
    expect(await r.background(one()).done).toEqual({ state: "cancelled", reason: "wrong branch" });
    expect(rowsOfType(r.rows(), "held")).toEqual([
      expect.objectContaining({ call: "explorer.1", reason: "cancelled" }),
    ]);
    const listed = listStepFiles(r.paths.steps);
    expect(listed.steps).toEqual([]);
    expect(listed.closes.map((c) => ({ attempt: c.attempt, agent_id: c.agent_id }))).toEqual([
      { attempt: 1, agent_id: a.threadId },
    ]);
  });
});

describe("a turn that ended with an error", () => {
  it.each(["failed", "interrupted"] as const)(
    "a turn %s with an error is a failure carrying its codexErrorInfo: the call is held for the host and the run pauses (S000-089)",
    async (ended) => {
      const b = await boundRun({ lostAfterMs: 60_000 });
      run = b.r;
      run.fake.failTurn(b.agent.threadId, "internalServerError", { message: "boom", ended });
      const r = run;
      // judged from the error at once: neither waited on as a turn that may go on nor judged by LostAfter
      await until("the call is held", () => rowsOfType(r.rows(), "held").length > 0, 5_000);
      expect(await b.done).toEqual({ state: "paused", reason: "held:explorer.1" });
      expect(rowsOfType(run.rows(), "held")[0]).toMatchObject({
        call: "explorer.1",
        reason: "host_failure",
        detail: "internalServerError: boom",
      });
      expect(lostRows(run)).toEqual([]);
    },
  );
});

/**
 * A host failure holds the explorer's call and pauses the run. While no process runs, the owner sends the
 * held subagent another turn (it runs again); the host ends an interrupted turn 400 ms after answering
 * the interrupt. A second process resumes the run with the same journal.
 */
describe("a call held for a host failure, resumed", () => {
  let r: InProcessRun;
  let first: { threadId: string; turnId: string };
  let stray = "";
  let paused: unknown;
  let resumed: unknown;
  let packet = "";
  let strangerReply = "";
  let attempt2: Extract<JournalRow, { type: "step_published" }> | undefined;

  beforeAll(async () => {
    const b = await boundRun({ lostAfterMs: 60_000 });
    r = b.r;
    first = b.agent;
    r.fake.failTurn(first.threadId, "internalServerError", { message: "boom" });
    paused = await b.done;
    r.fake.setThreadStatus(first.threadId, "idle");
    stray = r.fake.sendInput(first.threadId, "one more thing");
    r.fake.setInterruptDelay(400);
    const second = r.background(one());
    await until("the new attempt's step", () => rowsOfType(r.rows(), "step_published").length === 2);
    const s2 = (await r.steps()).find((s) => s.attempt === 2);
    if (!s2) throw new Error("no new attempt");
    attempt2 = rowsOfType(r.rows(), "step_published")[1] as typeof attempt2;
    packet = readFileSync(s2.packet, "utf8");
    // a subagent of another owner thread is not the run's
    const otherOwner = r.fake.createOwnerThread({ cwd: r.root });
    const stranger = r.fake.spawnSubagent({
      ownerThreadId: otherOwner,
      message: s2.message,
      agentRole: "explorer",
    });
    strangerReply = await r.report(s2, stranger.threadId);
    const c = r.spawn(s2, "explorer");
    expect(await r.report(s2, c.threadId)).toBe("bound");
    r.fake.answer(c.threadId, '{"n":5}');
    resumed = await second.done;
  });
  afterAll(() => r?.close());

  it("a host failure holds the call (S000-092)", () => {
    expect(paused).toEqual({ state: "paused", reason: "held:explorer.1" });
    expect(rowsOfType(r.rows(), "held")[0]).toMatchObject({ call: "explorer.1", reason: "host_failure" });
  });

  it("the held call goes on only once its old subagent is shown not running: its running turn interrupted and ended (S000-149)", () => {
    expect(resumed).toEqual({ state: "completed", result: { n: 5 } });
    const ended = r.fake.interruptsEnded.find((e) => e.threadId === first.threadId && e.turnId === stray);
    expect(ended, "the held subagent's running turn was not interrupted").toBeDefined();
    expect(Date.parse(attempt2?.at as string)).toBeGreaterThanOrEqual((ended?.at ?? 0) - 5);
  });

  it("the held call's turn is taken again by a new attempt whose packet says why the previous one stopped (S000-150)", () => {
    expect(attempt2).toMatchObject({ call: "explorer.1", k: 2, attempt: 2, action: "spawn" });
    expect(packet).toContain("was stopped: host_failure");
  });

  it("the resumed process runs the session again: its started row, step files and the run's own owner thread", () => {
    const started = rowsOfType(r.rows(), "started") as Array<Extract<JournalRow, { type: "started" }>>;
    expect(started.map((x) => [x.backend, x.process_n])).toEqual([
      ["session", 1],
      ["session", 2],
    ]);
    expect(strangerReply).toBe("refused");
    const bound = rowsOfType(r.rows(), "thread_started").at(-1) as Extract<
      JournalRow,
      { type: "thread_started" }
    >;
    expect(bound.parent_thread_id).toBe(r.owner);
  });
});

type Unwritten = Extract<JournalRow, { type: "step_unwritten" }>;

/**
 * A one-call run whose step write fails `failing` times the way a full disk does, on the packet or on the
 * step file, with a poll of 5 ms; the test then plays the owner. Each failed write's time is kept.
 */
async function unwrittenRun(failing: number, which: "packet" | "step file") {
  const r = await inProcessRun({ pollMs: 5 });
  const failedAt: number[] = [];
  const hook = (path: string) => {
    if (path.endsWith(which === "packet" ? ".md" : ".json") && failedAt.length < failing) {
      failedAt.push(performance.now());
      throw new Error("ENOSPC: no space left on device");
    }
  };
  const done = executeRun({
    paths: r.paths,
    spec: r.spec,
    host: r.host,
    processToken: null,
    workflow: one(),
    stepWriteHook: hook,
  });
  const step = await r.firstStep();
  const a = r.spawn(step, "explorer");
  expect(await r.report(step, a.threadId)).toBe("bound");
  r.fake.answer(a.threadId, '{"n":1}');
  const outcome = await done;
  return { r, outcome, warned: rowsOfType(r.rows(), "step_unwritten") as Unwritten[], failedAt };
}

describe("a step that cannot be written", () => {
  it.each(["packet", "step file"] as const)(
    "a step whose %s cannot be written was sent to nobody: step_unwritten says so with its marker, k, attempt, action and the error (S000-029)",
    async (which) => {
      const u = await unwrittenRun(3, which);
      run = u.r;
      expect(u.warned[0]).toMatchObject({
        marker: "explorer.1/t1-a1",
        k: 1,
        attempt: 1,
        action: "spawn",
        input_state: "not_delivered",
        error: expect.stringContaining("ENOSPC"),
      });
    },
  );

  it("the step is written again at each round of the run's loop until it is written (S000-030)", async () => {
    const u = await unwrittenRun(12, "step file");
    run = u.r;
    // twelve failed writes, then the one that made the file the owner took
    expect(u.failedAt).toHaveLength(12);
    expect(u.warned.at(-1)).toMatchObject({ written: true, failures: 12 });
  });

  it("a step that never can be written is tried until its turn ends: a subagent found by its marker stops the tries (S000-030)", async () => {
    run = await inProcessRun({ pollMs: 5 });
    const r = run;
    let tries = 0;
    const done = executeRun({
      paths: r.paths,
      spec: r.spec,
      host: r.host,
      processToken: null,
      workflow: one(),
      stepWriteHook: (path) => {
        if (!path.endsWith(".json")) return;
        tries++;
        throw new Error("ENOSPC: no space left on device");
      },
    });
    await until("a few tries", () => tries >= 3);
    // the owner spawned the step anyway (from the row): the run finds the subagent by its marker and binds it
    const step = rowsOfType(r.rows(), "step_published")[0] as Extract<JournalRow, { type: "step_published" }>;
    const a = r.fake.spawnSubagent({
      ownerThreadId: r.owner,
      message: spawnMessage(step.marker, step.role, step.workspace, step.packet),
      agentRole: "explorer",
    });
    await until("the bind", () => rowsOfType(r.rows(), "turn_started").length === 1);
    const atBind = tries;
    await new Promise((x) => setTimeout(x, 200));
    expect(tries).toBe(atBind);
    r.fake.answer(a.threadId, '{"n":1}');
    expect(await done).toMatchObject({ state: "completed" });
  });

  it("a call whose step could not be written for a while still ends with its answer, never unknown (S000-031)", async () => {
    const u = await unwrittenRun(12, "packet");
    run = u.r;
    expect(u.outcome).toEqual({ state: "completed", result: { n: 1 } });
    expect(rowsOfType(u.r.rows(), "completed")).toHaveLength(1);
  });

  it("a lasting failure is warned at the 1st, 10th and 100th failure, each with failures, first_at and last_at (S000-032)", async () => {
    const u = await unwrittenRun(105, "step file");
    run = u.r;
    const open = u.warned.filter((w) => !w.written);
    expect(open.map((w) => w.failures)).toEqual([1, 10, 100]);
    for (const w of open) {
      expect(Date.parse(w.first_at)).toBe(Date.parse(open[0]?.first_at as string));
      expect(Date.parse(w.last_at)).toBeGreaterThanOrEqual(Date.parse(w.first_at));
    }
    expect(Date.parse(open[2]?.last_at as string)).toBeGreaterThan(Date.parse(open[0]?.last_at as string));
  }, 60_000);

  it.each([1, 12, 105])(
    "after %i failures, a closing step_unwritten with written: true follows once the step is written (S000-033)",
    async (failing) => {
      const u = await unwrittenRun(failing, "step file");
      run = u.r;
      const closing = u.warned.filter((w) => w.written);
      expect(closing).toHaveLength(1);
      expect(closing[0]).toMatchObject({ written: true, failures: failing });
      expect(u.warned.at(-1)).toBe(closing[0]);
    },
    60_000,
  );

  it("step_unwritten carries input_state, marker, error, failures, first_at and last_at, and written only on the closing row (S000-177)", async () => {
    const u = await unwrittenRun(12, "step file");
    run = u.r;
    expect(u.warned).toHaveLength(3);
    for (const w of u.warned) {
      expect(w).toMatchObject({ input_state: "not_delivered", marker: "explorer.1/t1-a1" });
      expect(w.error).toContain("ENOSPC");
      expect(typeof w.failures).toBe("number");
      expect(Number.isNaN(Date.parse(w.first_at))).toBe(false);
      expect(Number.isNaN(Date.parse(w.last_at))).toBe(false);
    }
    expect(u.warned.map((w) => "written" in w)).toEqual([false, false, true]);
  });
});
