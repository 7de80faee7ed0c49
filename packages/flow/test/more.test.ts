import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  executeRun,
  type JournalRow,
  JournalWriter,
  readReply,
  type StepFile,
  spawnMessage,
  writeCancelRequest,
} from "@crw/flow";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import {
  appendStartedPrepared,
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  rowsOfType as of,
  countSchema as schema,
  showRun,
  until,
} from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const one = (role: "explorer" | "executor" = "explorer") =>
  defineWorkflow({ name: "one", run: (ctx) => ctx.call({ role, task: "count", schema }) });

/**
 * A journal whose last row of explorer.1 is the thread_started of `thread` (by default a subagent the host
 * does not know), then `more` rows.
 */
function journalAtGoneThread(r: InProcessRun, thread = "gone-thread", more: JournalRow[] = []): void {
  const P = join(r.paths.workspaces, "explorer.1");
  mkdirSync(P, { recursive: true });
  const input = { role: "explorer" as const, task: "count", schema, workspace: null };
  const w = JournalWriter.create(r.paths.journal, "run-1");
  appendStartedPrepared(w, "explorer.1", input, P);
  w.append([
    {
      type: "step_published",
      call: "explorer.1",
      op: "explorer.1/t1",
      k: 1,
      marker: "explorer.1/t1-a1",
      attempt: 1,
      action: "spawn",
      input: "count",
      input_digest: "sha256:i",
      packet: join(r.paths.steps, "explorer.1", "packet-t1-a1.md"),
      packet_digest: "sha256:p",
      role: "explorer",
      agent_type: "explorer",
      model: null,
      effort: null,
      workspace: P,
      conversation_turn: 1,
    },
  ]);
  w.append([
    {
      type: "thread_started",
      call: "explorer.1",
      thread_id: thread,
      model: null,
      effort: null,
      cwd: P,
      host_cwd: null,
      parent_thread_id: r.owner,
      agent_role: "explorer",
      attempt: 1,
      via: "session",
      rollout_path: null,
      marker: "explorer.1/t1-a1",
    },
  ]);
  if (more.length > 0) w.append(more as Parameters<JournalWriter["append"]>[0]);
  w.close();
}

describe("more of the session call", () => {
  describe("one session call, start to end", () => {
    let r: InProcessRun;
    let P: string;
    let s: StepFile;
    let stepFile: string;
    let packetText: string;
    const seen = { atPrepared: null as boolean | null, atPreparedDurable: null as boolean | null };
    let completedWhileRunning: number;
    let rows: JournalRow[];

    beforeAll(async () => {
      r = await inProcessRun();
      P = join(r.paths.workspaces, "explorer.1");
      // whether P exists as the prepared row is written, and as it is durable (before the engine goes on)
      const appendDurable = JournalWriter.prototype.appendDurable;
      const spy = vi.spyOn(JournalWriter.prototype, "appendDurable").mockImplementation(function (
        this: JournalWriter,
        batch,
      ) {
        const prepared = batch.some((x) => x.type === "prepared");
        if (prepared) seen.atPrepared = existsSync(P);
        const answer = appendDurable.call(this, batch);
        if (prepared) void answer.then(() => (seen.atPreparedDurable = existsSync(P)));
        return answer;
      });
      const { done } = r.background(one());
      s = await r.firstStep();
      spy.mockRestore();
      stepFile = readFileSync(join(r.paths.steps, "explorer.1", "t1-a1.json"), "utf8");
      packetText = readFileSync(s.packet, "utf8");
      const a = r.spawn(s, "explorer");
      expect(await r.report(s, a.threadId)).toBe("bound");
      await new Promise((x) => setTimeout(x, 200)); // the turn runs on: the run keeps reading it
      completedWhileRunning = of(r.rows(), "completed").length;
      r.fake.answer(a.threadId, '{"n":1}');
      expect(await done).toEqual({ state: "completed", result: { n: 1 } });
      rows = r.rows();
    }, 60_000);

    afterAll(async () => {
      await r?.close();
    });

    it("the call's directory P is made after its prepared row is durable, and is there when its step is published (S000-009)", () => {
      expect(seen).toEqual({ atPrepared: false, atPreparedDurable: false });
      expect(existsSync(P)).toBe(true);
      expect(s.workspace).toBe(P);
      const prepared = of(rows, "prepared")[0];
      const step = of(rows, "step_published")[0];
      expect(prepared?.seq).toBeLessThan(step?.seq as number);
    });

    it("the step file bus writes the packet at steps/<call>/packet-t<k>-a<n>.md and the step at steps/<call>/t<k>-a<n>.json (S000-025)", () => {
      expect(r.paths.steps).toBe(join(r.spec.repo, "..", "state", "flow", "run-1", "steps"));
      expect(s.packet).toBe(join(r.paths.steps, "explorer.1", "packet-t1-a1.md"));
      expect(of(rows, "step_published")[0]).toMatchObject({ packet: s.packet });
      expect(JSON.parse(stepFile)).toMatchObject({ call: "explorer.1", k: 1, attempt: 1 });
    });

    it("P is the call's cwd: the packet's workspace, the step's and the bound thread's cwd (no host cwd of its own)", () => {
      expect(packetText).toContain(`Your workspace is ${P}`);
      expect(of(rows, "thread_started")[0]).toMatchObject({ cwd: P });
      expect(of(rows, "thread_started")[0]).not.toMatchObject({ host_cwd: P });
    });

    it("on the session backend the packet alone carries the run's tools: the step and its spawn message name no environment (S000-048)", () => {
      const tmp = r.spec.env?.TMPDIR as string;
      expect(packetText).toContain(`- TMPDIR=${tmp}`);
      expect(packetText).toContain(`\`\`\`\nTMPDIR=${tmp}\n\`\`\``);
      expect(stepFile).not.toContain("TMPDIR");
      expect(Object.keys(JSON.parse(stepFile))).not.toContain("env");
      expect(s.message).not.toContain("TMPDIR");
    });

    it("the run reads the bound subagent until its marker turn ends: nothing completes while it runs, then completed (S000-083)", () => {
      expect(completedWhileRunning).toBe(0);
      const turn = of(rows, "turn_started")[0];
      const completed = of(rows, "completed");
      expect(completed).toHaveLength(1);
      expect(turn?.seq).toBeLessThan(completed[0]?.seq as number);
    });
  });

  it("a repair whose subagent is closed is a spawn on a new attempt, carrying the previous answer (S000-026 S000-018)", async () => {
    run = await inProcessRun();
    const { done } = run.background(one());
    const s = await run.firstStep();
    const a = run.spawn(s, "explorer");
    expect(await run.report(s, a.threadId)).toBe("bound");
    expect(of(run.rows(), "step_published")[0]).toMatchObject({ k: 1, attempt: 1, action: "spawn" });
    run.fake.answer(a.threadId, "oops");
    run.fake.closeAgent(a.threadId);
    await until("the repair step", () => of(run?.rows() ?? [], "step_published").length === 2);
    const repair = of(run.rows(), "step_published")[1];
    expect(repair).toMatchObject({
      k: 2,
      attempt: 2,
      action: "spawn",
      previous_answer: "oops",
      repair: { answer: "oops" },
    });
    expect(repair).not.toHaveProperty("agent_id");
    const s2 = (await run.steps()).find((x) => x.k === 2);
    if (!s2) throw new Error("no repair step");
    expect(readFileSync(s2.packet, "utf8")).toContain("oops");
    const b = run.spawn(s2, "explorer");
    expect(await run.report(s2, b.threadId)).toBe("bound");
    run.fake.answer(b.threadId, '{"n":2}');
    expect(await done).toEqual({ state: "completed", result: { n: 2 } });
  });

  it("thread_started once per attempt; a later attempt on another pair records prior_pairs (S000-077 S000-167)", async () => {
    run = await inProcessRun({ lostAfterMs: 200 });
    const { done } = run.background(one());
    const s = await run.firstStep();
    const a = run.spawn(s, "explorer", { model: "m-one", reasoningEffort: "low" });
    expect(await run.report(s, a.threadId)).toBe("bound");
    run.fake.setThreadStatus(a.threadId, "notLoaded");
    await until("attempt 2", () => of(run?.rows() ?? [], "step_published").length === 2);
    const s2 = (await run.steps()).find((x) => x.attempt === 2);
    if (!s2) throw new Error("no attempt 2");
    const b = run.spawn(s2, "explorer", { model: "m-two", reasoningEffort: "high" });
    expect(await run.report(s2, b.threadId)).toBe("bound");
    run.fake.answer(b.threadId, '{"n":3}');
    await done;
    const ts = of(run.rows(), "thread_started");
    expect(ts.map((r) => (r as { attempt: number }).attempt)).toEqual([1, 2]);
    expect(ts[1]).toMatchObject({
      model: "m-two",
      effort: "high",
      prior_pairs: [{ model: "m-one", effort: "low" }],
    });
  });

  it("crw flow show reads a call's pair from its newest thread_started row and the earlier pairs from its prior_pairs (S000-080)", async () => {
    run = await inProcessRun({ lostAfterMs: 200 });
    const { done } = run.background(one());
    const pairs = [
      { model: "m-one", reasoningEffort: "low" },
      { model: "m-two", reasoningEffort: "high" },
      { model: "m-three", reasoningEffort: "medium" },
    ];
    let last = "";
    for (const [i, pair] of pairs.entries()) {
      const attempt = i + 1;
      await until(`attempt ${attempt}`, () => of(run?.rows() ?? [], "step_published").length === attempt);
      const s = (await run.steps()).find((x) => x.attempt === attempt);
      if (!s) throw new Error(`no attempt ${attempt}`);
      const a = run.spawn(s, "explorer", pair);
      expect(await run.report(s, a.threadId)).toBe("bound");
      // the first two attempts are lost (their threads gone from the host), the third answers
      if (attempt < pairs.length) run.fake.setThreadStatus(a.threadId, "notLoaded");
      last = a.threadId;
    }
    run.fake.answer(last, '{"n":3}');
    await done;
    expect(of(run.rows(), "thread_started")).toHaveLength(3);
    const shown = await showRun(run);
    const call = shown.calls[0];
    expect(call).toMatchObject({
      call: "explorer.1",
      attempts: 3,
      pair: { model: "m-three", effort: "medium" },
      prior_pairs: [
        { model: "m-one", effort: "low" },
        { model: "m-two", effort: "high" },
      ],
    });
  });

  it("a turn whose rollout has no token count is left unmeasured (tokens_unmeasured, pauses: false) (S000-100)", async () => {
    run = await inProcessRun();
    const { done } = run.background(one());
    const s = await run.firstStep();
    const a = run.spawn(s, "explorer");
    expect(await run.report(s, a.threadId)).toBe("bound");
    run.fake.completeTurn(a.threadId, { messages: [{ text: '{"n":1}', phase: "final_answer" }] }); // no usage
    await done;
    expect(of(run.rows(), "tokens_unmeasured")[0]).toMatchObject({
      call: "explorer.1",
      k: 1,
      turn_id: a.turnId,
      pauses: false,
      reason: "the rollout has no token_count yet",
    });
    expect(of(run.rows(), "completed")[0]).toMatchObject({ tokens: {} });
  });

  it("a turn whose rollout cannot be read is left unmeasured (tokens_unmeasured, pauses: false) (S000-100)", async () => {
    run = await inProcessRun();
    const r = run;
    const { done } = r.background(one());
    const s = await r.firstStep();
    const a = r.spawn(s, "explorer");
    expect(await r.report(s, a.threadId)).toBe("bound");
    // the turn ends and its rollout goes away while the run cannot look
    await r.fake.setUnreachable();
    r.fake.answer(a.threadId, '{"n":1}', { input: 5, output: 1 });
    const { rmSync } = await import("node:fs");
    rmSync(r.fake.state.get(a.threadId).thread.path as string);
    await r.fake.setReachable();
    expect(await done).toEqual({ state: "completed", result: { n: 1 } });
    expect(of(r.rows(), "tokens_unmeasured")).toEqual([
      expect.objectContaining({
        call: "explorer.1",
        k: 1,
        pauses: false,
        reason: expect.stringMatching(/ENOENT|no such file/),
      }),
    ]);
    expect(of(r.rows(), "completed")[0]).toMatchObject({ tokens: {} });
  });

  it("two unreported subagents carrying one marker: session_host_warning several_spawns with the op (S000-174)", async () => {
    run = await inProcessRun();
    const { done } = run.background(one());
    const s = await run.firstStep();
    const a = run.spawn(s, "explorer");
    run.spawn(s, "explorer");
    await until("a bind by lookup", () => of(run?.rows() ?? [], "thread_started").length === 1);
    expect(of(run.rows(), "session_host_warning")[0]).toMatchObject({
      op: "explorer.1/t1",
      warnings: ["several_spawns"],
    });
    const bound = (of(run.rows(), "thread_started")[0] as { thread_id: string }).thread_id;
    run.fake.answer(bound, '{"n":1}');
    if (bound !== a.threadId) run.fake.answer(a.threadId, '{"n":1}');
    expect(await done).toMatchObject({ state: "completed" });
  });

  it("a report that names no subagent is refused (S000-062)", async () => {
    run = await inProcessRun();
    const { done } = run.background(one());
    const s = await run.firstStep();
    mkdirSync(run.paths.inbox, { recursive: true });
    writeFileSync(
      join(run.paths.inbox, "explorer.1.t7-a1.x.json"),
      JSON.stringify({
        format: "crw-flow-dispatch/1",
        run_id: "run-1",
        call: "explorer.1",
        k: 7,
        attempt: 1,
      }),
    );
    await until("the reply", () => readReply(run?.paths.replies ?? "", "explorer.1.t7-a1.x.json") !== null);
    expect(readReply(run.paths.replies, "explorer.1.t7-a1.x.json")).toMatchObject({
      reply: "refused",
      reason: "the report names no subagent",
    });
    const a = run.spawn(s, "explorer");
    expect(await run.report(s, a.threadId)).toBe("bound");
    run.fake.answer(a.threadId, '{"n":1}');
    await done;
  });

  it("a step still unwritten when its turn ends (the run pauses) gets a closing step_unwritten with written: false (S000-034)", async () => {
    run = await inProcessRun({ pollMs: 5 });
    const wf = defineWorkflow({
      name: "two",
      run: (ctx) =>
        Promise.all([
          ctx.call({ role: "explorer", task: "a", schema }),
          ctx.call({ role: "reviewer", task: "b", schema }),
        ]),
    });
    const hook = (path: string) => {
      if (path.includes("/reviewer.1/")) throw new Error("ENOSPC: no space left on device");
    };
    const done = executeRun({
      paths: run.paths,
      spec: run.spec,
      host: run.host,
      processToken: null,
      workflow: wf,
      stepWriteHook: hook,
    });
    const s = await run.firstStep();
    const a = run.spawn(s, "explorer");
    expect(await run.report(s, a.threadId)).toBe("bound");
    run.fake.failTurn(a.threadId, "usageLimitExceeded");
    expect(await done).toMatchObject({ state: "paused" });
    const rows = of(run.rows(), "step_unwritten").filter(
      (r) => (r as { call: string }).call === "reviewer.1",
    );
    expect(rows[0]).toMatchObject({ failures: 1 });
    expect(rows.at(-1)).toMatchObject({ written: false });
    expect(of(run.rows(), "held").some((r) => (r as { call: string }).call === "reviewer.1")).toBe(true); // not ended unknown
  });

  it("a resume whose last row is session_attempt_lost closes the old subagent and spawns the next attempt (S000-148)", async () => {
    run = await inProcessRun();
    const r = run;
    journalAtGoneThread(r, "gone-thread", [
      {
        type: "session_attempt_lost",
        call: "explorer.1",
        op: "explorer.1/t1",
        attempt: 1,
        agent_id: "gone-thread",
        k: 1,
        turn_id: null,
        reason: "thread unknown for LostAfter",
        host_status: "unknown",
        turn_status: null,
      } as unknown as JournalRow,
    ]);
    const { done } = r.background(one());
    const s2 = (await r.steps()).find((x) => x.attempt === 2);
    if (!s2) throw new Error("no attempt 2");
    expect(s2).toMatchObject({ k: 1, action: "spawn" });
    expect(existsSync(join(r.paths.steps, "explorer.1", "close-a1-gone-thread.json"))).toBe(true);
    // the loss is the dead process's: the resume writes no second one
    expect(of(r.rows(), "session_attempt_lost")).toHaveLength(1);
    const b = r.spawn(s2, "explorer");
    expect(await r.report(s2, b.threadId)).toBe("bound");
    r.fake.answer(b.threadId, '{"n":4}');
    expect(await done).toEqual({ state: "completed", result: { n: 4 } });
  });

  it.each(["unknown", "notLoaded", "systemError"] as const)(
    "resuming at thread_started, a subagent the host shows %s for LostAfter loses the attempt, and the next one is spawned (S000-143)",
    async (status) => {
      run = await inProcessRun({ lostAfterMs: 200 });
      const r = run;
      // a subagent the host knows runs no turn of the step's marker; the unknown one is not on the host
      let thread = "gone-thread";
      if (status !== "unknown") {
        thread = r.fake.spawnSubagent({
          ownerThreadId: r.owner,
          message: "other work",
          agentRole: "explorer",
        }).threadId;
        r.fake.setThreadStatus(thread, status);
      }
      journalAtGoneThread(r, thread);
      const startedAt = Date.now();
      const { done } = r.background(one());
      await until("the attempt to be lost", () => of(r.rows(), "session_attempt_lost").length === 1);
      const lostRow = of(r.rows(), "session_attempt_lost")[0];
      expect(lostRow).toMatchObject({ attempt: 1, agent_id: thread, host_status: status });
      expect(Date.parse(lostRow?.at as string)).toBeGreaterThanOrEqual(startedAt + 200);
      const s2 = (await r.steps()).find((x) => x.attempt === 2);
      if (!s2) throw new Error("no attempt 2");
      expect(s2.action).toBe("spawn");
      const b = r.spawn(s2, "explorer");
      expect(await r.report(s2, b.threadId)).toBe("bound");
      r.fake.answer(b.threadId, '{"n":4}');
      expect(await done).toEqual({ state: "completed", result: { n: 4 } });
    },
  );

  it("a stop reaching a call whose subagent is named but its turn not yet bound writes that turn's turn_started before the interrupt (S000-105)", async () => {
    run = await inProcessRun();
    const r = run;
    // the dead process's bind was torn after thread_started; the subagent's marker turn still runs
    const P = join(r.paths.workspaces, "explorer.1");
    const agent = r.fake.spawnSubagent({
      ownerThreadId: r.owner,
      message: spawnMessage(
        "explorer.1/t1-a1",
        "explorer",
        P,
        join(r.paths.steps, "explorer.1", "packet-t1-a1.md"),
      ),
      agentRole: "explorer",
    });
    journalAtGoneThread(r, agent.threadId);
    writeCancelRequest(r.paths, "stop now");
    const { done } = r.background(one());
    expect(await done).toEqual({ state: "cancelled", reason: "stop now" });
    const own = r.rows().filter((x) => "call" in x && x.call === "explorer.1");
    expect(own.slice(-3).map((x) => [x.type, (x as { turn_id?: string }).turn_id])).toEqual([
      ["turn_started", agent.turnId],
      ["interrupt_requested", agent.turnId],
      ["held", undefined],
    ]);
    expect(r.fake.state.turn(agent.threadId, agent.turnId).status).toBe("interrupted");
  });

  it("resuming at thread_started, a host that cannot be asked judges nothing and starts no LostAfter clock (S000-144)", async () => {
    run = await inProcessRun({ lostAfterMs: 300 });
    journalAtGoneThread(run);
    await run.fake.setUnreachable();
    const { done } = run.background(one());
    await new Promise((r) => setTimeout(r, 800)); // well past LostAfter, the host unreachable all along
    expect(of(run.rows(), "session_attempt_lost")).toHaveLength(0);
    const reachable = Date.now();
    await run.fake.setReachable();
    await until(
      "the attempt to be lost once the host answers",
      () => of(run?.rows() ?? [], "session_attempt_lost").length === 1,
    );
    // the clock starts at the first answer: the attempt is lost a full LostAfter after the host is back
    expect(Date.parse(of(run.rows(), "session_attempt_lost")[0]?.at ?? "")).toBeGreaterThanOrEqual(
      reachable + 300,
    );
    const s2 = (await run.steps()).find((x) => x.attempt === 2);
    if (!s2) throw new Error("no attempt 2");
    const b = run.spawn(s2, "explorer");
    expect(await run.report(s2, b.threadId)).toBe("bound");
    run.fake.answer(b.threadId, '{"n":4}');
    expect(await done).toEqual({ state: "completed", result: { n: 4 } });
  });

  it("a host that cannot be asked leaves a running LostAfter clock running: the attempt is lost at the first answer after it ran out (S000-144)", async () => {
    run = await inProcessRun({ lostAfterMs: 1_500 });
    const r = run;
    journalAtGoneThread(r);
    const reads = () => r.fake.requests.filter((q) => q.method === "thread/read").length;
    const { done } = r.background(one());
    await until("the host to answer a read of the subagent", () => reads() > 0);
    await r.fake.setUnreachable(); // the clock runs from that answer
    await new Promise((res) => setTimeout(res, 2_000));
    expect(of(r.rows(), "session_attempt_lost")).toHaveLength(0);
    const reachable = Date.now();
    await r.fake.setReachable();
    await until("the attempt to be lost", () => of(r.rows(), "session_attempt_lost").length === 1);
    // a clock started again by the unanswered reads would hold the loss a full LostAfter after this
    expect(Date.parse(of(r.rows(), "session_attempt_lost")[0]?.at ?? "")).toBeLessThan(reachable + 1_500);
    const s2 = (await r.steps()).find((x) => x.attempt === 2);
    if (!s2) throw new Error("no attempt 2");
    const b = r.spawn(s2, "explorer");
    expect(await r.report(s2, b.threadId)).toBe("bound");
    r.fake.answer(b.threadId, '{"n":4}');
    expect(await done).toEqual({ state: "completed", result: { n: 4 } });
  });

  it("a resume takes the role store's new pairs, records them in its started row and the change in policy_repinned (S000-225)", async () => {
    run = await inProcessRun();
    const first = run.background(one());
    const s = await run.firstStep();
    const a = run.spawn(s, "explorer");
    expect(await run.report(s, a.threadId)).toBe("bound");
    run.fake.failTurn(a.threadId, "internalServerError");
    await first.done;
    mkdirSync(join(run.spec.repo, ".crw"), { recursive: true });
    writeFileSync(
      join(run.spec.repo, ".crw", "flow-roles.json"),
      JSON.stringify({ roles: { explorer: { model: "m-new" } } }),
    );
    const second = run.background(one());
    const [s2] = (await run.steps()).filter((x) => x.attempt === 2);
    if (!s2) throw new Error("no new attempt");
    expect(s2.model).toBe("m-new");
    const started = of(run.rows(), "started");
    expect(started).toHaveLength(2);
    expect((started[1] as { role_pairs: Record<string, unknown> }).role_pairs.explorer).toEqual({
      model: "m-new",
      effort: null,
    });
    const rep = of(run.rows(), "policy_repinned")[0];
    expect(rep).toMatchObject({
      pinned_digest: (started[0] as { policy_digest: string }).policy_digest,
      store_digest: (started[1] as { policy_digest: string }).policy_digest,
    });
    const b = run.spawn(s2, "explorer", { model: "m-new" });
    expect(await run.report(s2, b.threadId)).toBe("bound");
    run.fake.answer(b.threadId, '{"n":1}');
    await second.done;
  });
});
