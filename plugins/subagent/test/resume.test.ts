import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import {
  type NodeContinueRequest,
  type NodeDispatcher,
  type NodeRecoveryHost,
  type NodeRunResult,
  type PgWorkflowStore,
  parseWorkflowDefinition,
  WorkflowBoundaryError,
  type WorkflowEngine,
} from "../src/index.js";
import {
  closeEnginesAfterEach,
  deferred,
  summaries,
  taskLine,
  until,
  workflowJournal,
  world,
} from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

const def = parseWorkflowDefinition(`
name: flaky
nodes:
  - { id: ok, task: "TASK ok", tools: { allow: ["Bash", "Read"] } }
  - { id: flaky, task: "TASK flaky", dependsOn: [ok] }
  - { id: last, task: "TASK last", dependsOn: [flaky] }
`);

const journal = (workflowId: string) => workflowJournal(db.pool, workflowId);

async function failedOnce(w: Awaited<ReturnType<typeof world>>, access?: { tools: { deny: string[] } }) {
  let fail = true;
  const runs: string[] = [];
  const { engine } = await w.engine(({ task, sessionId }) => {
    runs.push(`${taskLine(task)}@${sessionId}`);
    if (taskLine(task) === "TASK flaky" && fail) {
      fail = false;
      throw new Error("flaky provider");
    }
    return `done ${taskLine(task)}`;
  });
  all.push(engine);
  const ctx = w.ctx(access ? { access } : {});
  const started = await engine.start(ctx, { definition: def });
  const outcome = await engine.finished(started.workflowId);
  expect(outcome.status).toBe("failed");
  return { engine, ctx, started, runs };
}

describe("explicit WorkflowResume", () => {
  it("resume re-captures access, target and cwd, on which a fresh node runs while the children made before keep theirs, advances the generation and retries a failed node in its own child (S004-297 S004-298 S004-390)", async () => {
    const w = await world(db.pool);
    // the workflow started under an access denying Write; by the resume the origin turn's access allows it
    const { engine, ctx, started, runs } = await failedOnce(w, { tools: { deny: ["Write"] } });
    const before = await journal(started.workflowId);
    const flakyChild = before.nodes.flaky?.childSessionId as string;
    let accessCaptured = 0;
    let cwdCaptured = 0;
    const resumed = await engine.resume(
      {
        ...ctx,
        toolCallId: "resume-call",
        currentAccess: async () => {
          accessCaptured++;
          return {
            ...(await ctx.currentAccess()),
            target: { kind: "host" as const, ref: "moved-project" },
            tools: { deny: [] },
          };
        },
        currentWorkDir: async () => {
          cwdCaptured++;
          return "/srv/new-place";
        },
      },
      started.workflowId,
    );
    expect(resumed.workflowId).toBe(started.workflowId);
    expect([accessCaptured, cwdCaptured]).toEqual([1, 1]);
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("completed");
    expect(outcome.summary).toContain("completed, run 2");
    // The failed node ran again in the same child; the succeeded one did not run again.
    expect(runs.filter((r) => r.startsWith("TASK flaky"))).toEqual([
      `TASK flaky@${flakyChild}`,
      `TASK flaky@${flakyChild}`,
    ]);
    expect(runs.filter((r) => r.startsWith("TASK ok"))).toHaveLength(1);
    const row = await engine.store.getWorkflow(started.workflowId);
    expect(row?.recovery.workflowGeneration).toBe(2);
    // A fresh node under the new boundary took the new cwd.
    const { rows } = await db.pool.query("select scope from sessions where parent_session_id = $1::uuid", [
      w.parentSessionId,
    ]);
    const workDirs = rows.map((r) => JSON.parse(r.scope).workDir);
    expect(workDirs).toContain("/srv/new-place");
    expect(workDirs.filter((d) => d === null)).toHaveLength(2); // ok and flaky kept their first placement
    // the fresh node runs on the access captured again; the nodes made before keep theirs
    const scopes = rows.map((r) => JSON.parse(r.scope));
    const deniesWrite = (workDir: string | null) =>
      scopes.filter((sc) => sc.workDir === workDir).map((sc) => sc.tools?.deny?.includes("Write") ?? false);
    expect(deniesWrite("/srv/new-place")).toEqual([false]);
    expect(deniesWrite(null)).toEqual([true, true]);
    // and on the target captured again; the children made before keep the one they were placed on
    const targetOf = (workDir: string | null) =>
      scopes.filter((sc) => sc.workDir === workDir).map((sc) => sc.target);
    expect(targetOf("/srv/new-place")).toEqual([{ kind: "host", ref: "moved-project" }]);
    const first = (await ctx.currentAccess()).target;
    expect(first).not.toEqual({ kind: "host", ref: "moved-project" });
    expect(targetOf(null)).toEqual([first, first]);
    const results = await summaries(db.pool, w.parentSessionId);
    expect(results.map((r) => r.outcome)).toEqual(["error", "ok"]);
    // One summary per tool call: the resumed run's answers the WorkflowResume call.
    const { rows: calls } = await db.pool.query(
      "select tool_call_id from delegation_results where parent_session_id = $1::uuid order by queue_seq",
      [w.parentSessionId],
    );
    expect(calls.map((r) => r.tool_call_id)).toEqual([ctx.toolCallId, "resume-call"]);
  });

  it("each boundary, the parent's then each node's, is answered one at a time before any node runs (S004-326)", async () => {
    const w = await world(db.pool);
    const { engine, ctx, started, runs } = await failedOnce(w);
    const ranBefore = runs.length;
    const answered: Array<[string, number]> = [];
    let checking = 0;
    let most = 0;
    await engine.resume({ ...ctx, toolCallId: "resume-call" }, started.workflowId, async ({ subject }) => {
      most = Math.max(most, ++checking);
      // slow enough that a node launched before this answer would have reached its runner
      await new Promise((r) => setTimeout(r, 30));
      answered.push([subject, runs.length]);
      checking--;
      return { ok: true };
    });
    expect((await engine.finished(started.workflowId)).status).toBe("completed");
    expect(answered).toEqual([
      ["parent", ranBefore],
      ["ok", ranBefore],
      ["flaky", ranBefore],
    ]);
    expect(most).toBe(1);
    expect(runs.length).toBeGreaterThan(ranBefore);
  });

  it("a node that failed before it had a child is prepared afresh on resume: it never continues a child", async () => {
    const w = await world(db.pool);
    const runs: string[] = [];
    const { engine } = await w.engine(({ task }) => {
      runs.push(taskLine(task));
      return `done ${taskLine(task)}`;
    });
    all.push(engine);
    const ctx = w.ctx();
    const budget = parseWorkflowDefinition(`
name: budget
maxDispatches: 1
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);
    const started = await engine.start(ctx, { definition: budget });
    expect((await engine.finished(started.workflowId)).status).toBe("failed");
    const before = await journal(started.workflowId);
    expect(before.nodes.b).toMatchObject({ status: "failed", error: { code: "dispatch_budget_exhausted" } });
    expect(before.nodes.b?.childSessionId).toBeUndefined();
    await engine.resume({ ...ctx, toolCallId: "resume-call" }, started.workflowId);
    const outcome = await engine.finished(started.workflowId);
    // b was reserved afresh (the budget is charged again and still spent), never continued as a retry
    expect(outcome.status).toBe("failed");
    const after = await journal(started.workflowId);
    expect(after.nodes.b).toMatchObject({ status: "failed", error: { code: "dispatch_budget_exhausted" } });
    expect(after.nodes.b?.childSessionId).toBeUndefined();
    expect(after.nodes.b?.run).toBe(2);
    expect(runs).toEqual(["TASK a"]);
  });

  it("refuses to resume a running workflow or another session's workflow", async () => {
    const w = await world(db.pool);
    const gate = deferred();
    const { engine } = await w.engine(async () => {
      await gate.promise;
      return "x";
    });
    all.push(engine);
    const ctx = w.ctx();
    const started = await engine.start(ctx, { definition: def });
    await expect(engine.resume(ctx, started.workflowId)).rejects.toMatchObject({ code: "not_resumable" });
    const other = await world(db.pool);
    await expect(engine.resume(other.ctx(), started.workflowId)).rejects.toMatchObject({
      code: "workflow_not_found",
    });
    gate.resolve();
    await engine.finished(started.workflowId);
  });
});

/**
 * One workflow: `remote` parks on a committed prerequisite (its dispatch returned waiting, nothing ran),
 * `after` depends on it, `free` is independent. Wakes that miss one field each are refused, a second engine
 * without the run is asked, then the exact wake is accepted (under a newer admission version) and its
 * continuation is held at a gate while the stored rows are read. Two more workflows' nodes report waiting
 * without a prerequisite, or with a malformed one.
 */
// No dispatcher of crw returns a waiting result and nothing in the daemon wakes a node: these tests hold the
// engine's waiting-node path to its contract until a computer wait uses it.
describe("waiting nodes", () => {
  const waitDef = parseWorkflowDefinition(`
name: waits
nodes:
  - { id: remote, task: "TASK remote" }
  - { id: after, task: "TASK after", dependsOn: [remote] }
  - { id: free, task: "TASK free" }
`);
  type Journal = Awaited<ReturnType<typeof journal>>;
  const ran: string[] = [];
  const continued: string[] = [];
  let remoteDispatches = 0;
  let parkedJournal: Journal;
  let parkedRow: Awaited<ReturnType<PgWorkflowStore["getWorkflow"]>>;
  let parkedEvents: string[];
  let parkedSummaries: unknown[];
  let childrenParked: number;
  let childrenAfterRefusals: number;
  const refusals: Record<string, unknown> = {};
  let elsewhereAnswer: unknown;
  let elsewhereContinued = 0;
  let accepted: unknown;
  let activeAtAccept: string[];
  let continuedAtAccept: number;
  let duplicate: unknown;
  let dispatchesBefore: number | undefined;
  let dispatchesAtAccept: number | undefined;
  let recoveryAtAccept: unknown;
  let runAtAccept: number | undefined;
  let woken: Journal;
  let wokenRow: Awaited<ReturnType<PgWorkflowStore["getWorkflow"]>>;
  let outcome: Awaited<ReturnType<WorkflowEngine["finished"]>>;
  let finalRow: Awaited<ReturnType<PgWorkflowStore["getWorkflow"]>>;
  let afterEnd: unknown;
  let bare: Journal;
  let bareOutcome: Awaited<ReturnType<WorkflowEngine["finished"]>>;
  let malformed: Journal;

  beforeAll(async () => {
    const w = await world(db.pool);
    const gate = deferred();
    const atGate = deferred();
    const { engine, events, dispatcher } = await w.engine(
      ({ task }) => {
        ran.push(taskLine(task));
        return `done ${taskLine(task)}`;
      },
      {
        wrap: (base): NodeDispatcher => ({
          createChild: (r) => base.createChild(r),
          runNode: async (r) => {
            if (r.nodeId !== "remote") return base.runNode(r);
            remoteDispatches++;
            // The computer is offline: the host committed a prerequisite; nothing ran.
            return { status: "waiting", prerequisite: { waitId: "wait-1", claimVersion: 3 } };
          },
          continueNode: async (r, host) => {
            continued.push(r.nodeId);
            atGate.resolve();
            await gate.promise;
            return base.continueNode(r, host);
          },
        }),
      },
    );
    all.push(engine);
    const ctx = w.ctx();
    const started = await engine.start(ctx, { definition: waitDef });
    const id = started.workflowId;
    await until(
      async () =>
        (await journal(id)).nodes.free?.status === "succeeded" &&
        (await journal(id)).nodes.remote?.status === "waiting" &&
        // the run lets the node go only after its waiting state is committed
        engine.run(id)?.active.has("remote") === false,
      "free done, remote waiting",
    );
    const children = async () =>
      (
        await db.pool.query("select count(*)::int n from sessions where parent_session_id = $1::uuid", [
          w.parentSessionId,
        ])
      ).rows[0].n as number;
    parkedJournal = await journal(id);
    parkedRow = await engine.store.getWorkflow(id);
    parkedEvents = events.map((e) => e.type);
    parkedSummaries = await summaries(db.pool, w.parentSessionId);
    childrenParked = await children();
    const wake = {
      workflowId: id,
      parentSessionId: w.parentSessionId,
      toolCallId: ctx.toolCallId,
      workflowGeneration: 1,
      recoveryAdmissionVersion: 2,
      nodeId: "remote",
      waitId: "wait-1",
      claimVersion: 3,
      continueNode: (i: NodeContinueRequest, h?: NodeRecoveryHost) => dispatcher.continueNode(i, h),
    };
    const other = await world(db.pool);
    refusals.workflowId = engine.resumeWaitingNode({ ...wake, workflowId: randomUUID() });
    refusals.parentSessionId = engine.resumeWaitingNode({ ...wake, parentSessionId: other.parentSessionId });
    refusals.toolCallId = engine.resumeWaitingNode({ ...wake, toolCallId: "other" });
    refusals.workflowGeneration = engine.resumeWaitingNode({ ...wake, workflowGeneration: 2 });
    refusals.nodeId = engine.resumeWaitingNode({ ...wake, nodeId: "free" });
    refusals.pendingNode = engine.resumeWaitingNode({ ...wake, nodeId: "after" });
    refusals.waitId = engine.resumeWaitingNode({ ...wake, waitId: "wait-0" });
    refusals.claimVersion = engine.resumeWaitingNode({ ...wake, claimVersion: 2 });
    refusals.olderAdmission = engine.resumeWaitingNode({ ...wake, recoveryAdmissionVersion: 0 });
    await new Promise((r) => setTimeout(r, 50));
    childrenAfterRefusals = await children();
    // Another process's engine: it does not drive the workflow, so it holds no live control of it.
    const elsewhere = await w.engine(() => "never", {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        runNode: (r) => base.runNode(r),
        continueNode: (r, host) => {
          elsewhereContinued++;
          return base.continueNode(r, host);
        },
      }),
    });
    all.push(elsewhere.engine);
    elsewhereAnswer = elsewhere.engine.resumeWaitingNode({
      ...wake,
      continueNode: (i, h) => elsewhere.dispatcher.continueNode(i, h),
    });
    dispatchesBefore = engine.run(id)?.journal.dispatches;
    accepted = engine.resumeWaitingNode(wake);
    // Read synchronously, before anything is awaited.
    activeAtAccept = [...(engine.run(id)?.active.keys() ?? [])];
    continuedAtAccept = continued.length;
    duplicate = engine.resumeWaitingNode(wake);
    dispatchesAtAccept = engine.run(id)?.journal.dispatches;
    recoveryAtAccept = { ...engine.run(id)?.journal.recovery };
    runAtAccept = engine.run(id)?.journal.run;
    await atGate.promise;
    woken = await journal(id);
    wokenRow = await engine.store.getWorkflow(id);
    gate.resolve();
    outcome = await engine.finished(id);
    finalRow = await engine.store.getWorkflow(id);
    afterEnd = engine.resumeWaitingNode(wake);

    // A node that reports waiting with no prerequisite, or a malformed one.
    const bareRun = await w.engine(({ task }) => `done ${taskLine(task)}`, {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        runNode: async (r) =>
          r.nodeId === "remote" ? ({ status: "waiting" } as unknown as NodeRunResult) : base.runNode(r),
        continueNode: (r, host) => base.continueNode(r, host),
      }),
    });
    all.push(bareRun.engine);
    const bareStarted = await bareRun.engine.start(w.ctx(), { definition: waitDef });
    bareOutcome = await bareRun.engine.finished(bareStarted.workflowId);
    bare = await journal(bareStarted.workflowId);
    const badRun = await w.engine(({ task }) => `done ${taskLine(task)}`, {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        runNode: async (r) =>
          r.nodeId === "remote"
            ? { status: "waiting", prerequisite: { waitId: "", claimVersion: -1 } }
            : base.runNode(r),
        continueNode: (r, host) => base.continueNode(r, host),
      }),
    });
    all.push(badRun.engine);
    const badStarted = await badRun.engine.start(w.ctx(), { definition: waitDef });
    await badRun.engine.finished(badStarted.workflowId);
    malformed = await journal(badStarted.workflowId);
  });

  it("a waiting node stays nonterminal with its prerequisite: its dependent is held, the independent node completes", () => {
    expect(parkedJournal.nodes.remote?.status).toBe("waiting");
    expect(parkedJournal.nodes.remote?.waiting).toEqual({ waitId: "wait-1", claimVersion: 3 });
    expect(parkedJournal.nodes.after?.status).toBe("pending");
    expect(parkedJournal.nodes.free?.status).toBe("succeeded");
    expect(parkedRow?.status).toBe("running");
    // The dependent ran only after the wake, and then succeeded.
    expect(ran).toEqual(["TASK free", "TASK remote", "TASK after"]);
    expect(outcome.summary).toContain("- after: succeeded");
  });

  it("no whole-workflow completion is emitted while the only unfinished node waits", () => {
    expect(parkedEvents).not.toContain("workflow");
    expect(parkedSummaries).toEqual([]);
    expect(parkedRow?.summaryResultId ?? null).toBeNull();
    // The completion came only once the woken node ended.
    expect(outcome.status).toBe("completed");
  });

  it("a wake must match the workflow, origin, call, generation, held node, wait id and claim version", () => {
    expect(refusals).toEqual({
      workflowId: { status: "not-held" },
      parentSessionId: { status: "not-held" },
      toolCallId: { status: "not-held" },
      workflowGeneration: { status: "stale" },
      nodeId: { status: "not-held" },
      pendingNode: { status: "not-held" },
      waitId: { status: "stale" },
      claimVersion: { status: "stale" },
      olderAdmission: { status: "stale" },
    });
    // None of the refused wakes reached the node.
    expect(continuedAtAccept).toBe(0);
    expect(accepted).toEqual({ status: "accepted" });
  });

  it("an accepted wake reserves the node before returning: a duplicate wake finds it no longer held", () => {
    expect(activeAtAccept).toEqual(["remote"]);
    expect(duplicate).toEqual({ status: "not-held" });
    expect(continued).toEqual(["remote"]);
  });

  it("a wake after the dispatch parked adopts the newer admission version and invents no generation", () => {
    expect(parkedJournal.recovery).toEqual({ workflowGeneration: 1, recoveryAdmissionVersion: 1 });
    expect(recoveryAtAccept).toEqual({ workflowGeneration: 1, recoveryAdmissionVersion: 2 });
    // Journaled running under the adopted version before the continuation ran.
    expect(woken.nodes.remote?.status).toBe("running");
    expect(woken.recovery).toEqual({ workflowGeneration: 1, recoveryAdmissionVersion: 2 });
    expect(wokenRow?.recovery.workflowGeneration).toBe(1);
    expect(finalRow?.recovery.workflowGeneration).toBe(1);
    expect(runAtAccept).toBe(1);
  });

  it("a waiting result parks only with a committed prerequisite; without one, or a malformed one, the node fails", () => {
    expect(parkedJournal.nodes.remote?.waiting).toEqual({ waitId: "wait-1", claimVersion: 3 });
    expect(bare.nodes.remote?.status).toBe("failed");
    expect(bare.nodes.remote?.error?.code).toBe("waiting_without_prerequisite");
    expect(bare.nodes.remote?.waiting).toBeUndefined();
    expect(bare.nodes.after?.status).toBe("blocked");
    expect(bareOutcome.status).toBe("failed");
    expect(malformed.nodes.remote?.status).toBe("failed");
    expect(malformed.nodes.remote?.error?.code).toBe("waiting_without_prerequisite");
  });

  it("waiting is neither empty nor complete: no fallback dispatch, no second child, the node is not ended", () => {
    expect(parkedJournal.nodes.remote?.status).toBe("waiting");
    expect(parkedJournal.nodes.remote?.error).toBeUndefined();
    expect(parkedJournal.nodes.remote?.handover).toBeUndefined();
    expect(remoteDispatches).toBe(1);
    expect(continuedAtAccept).toBe(0);
    expect(childrenAfterRefusals).toBe(childrenParked);
    expect(ran.filter((t) => t === "TASK remote")).toHaveLength(1);
  });

  it("the wake targets the exact held node and answers accepted, stale or not-held", () => {
    expect(accepted).toEqual({ status: "accepted" });
    expect(refusals.waitId).toEqual({ status: "stale" });
    expect(refusals.nodeId).toEqual({ status: "not-held" });
    expect(continued).toEqual(["remote"]);
    expect(woken.nodes.free?.status).toBe("succeeded");
    expect(woken.nodes.after?.status).toBe("pending");
  });

  it("acceptance queues only that node: nothing dispatched or charged, no whole-workflow resume", () => {
    expect(activeAtAccept).toEqual(["remote"]);
    expect(continuedAtAccept).toBe(0);
    expect(dispatchesAtAccept).toBe(dispatchesBefore);
    expect(woken.dispatches).toBe(dispatchesBefore);
    expect(runAtAccept).toBe(1);
    expect(woken.run).toBe(1);
    expect(ran.filter((t) => t === "TASK free")).toHaveLength(1);
  });

  it("without the live run no wake reaches the node: another engine and the ended run answer not-held", () => {
    expect(elsewhereAnswer).toEqual({ status: "not-held" });
    expect(elsewhereContinued).toBe(0);
    expect(afterEnd).toEqual({ status: "not-held" });
    expect(continued).toEqual(["remote"]);
  });
});

/**
 * A workflow that failed once is resumed twice, each refused: first under a grant whose Bash entry only
 * overlaps the journaled one, then with an async boundary hook that refuses the node "flaky".
 */
describe("a resume whose journaled boundary no longer holds", () => {
  let overlapping: unknown;
  let hooked: unknown;
  const asked: string[] = [];
  let ranBefore: number;
  let ranAfter: number;
  let journalBefore: unknown;
  let journalAfter: unknown;
  let row: Awaited<ReturnType<PgWorkflowStore["getWorkflow"]>>;
  beforeAll(async () => {
    const w = await world(db.pool);
    const { engine, ctx, started, runs } = await failedOnce(w);
    ranBefore = runs.length;
    journalBefore = await journal(started.workflowId);
    const narrower = {
      ...ctx,
      currentAccess: async () => ({
        ...(await ctx.currentAccess()),
        tools: { allow: ["Bash(git *)", "Read"] },
      }),
    };
    overlapping = await engine.resume(narrower, started.workflowId).catch((e: unknown) => e);
    hooked = await engine
      .resume(ctx, started.workflowId, async ({ subject }) => {
        asked.push(subject);
        await new Promise((r) => setTimeout(r, 1));
        return subject === "flaky" ? { ok: false, reason: "node boundary moved" } : { ok: true };
      })
      .catch((e: unknown) => e);
    ranAfter = runs.length;
    journalAfter = await journal(started.workflowId);
    row = await engine.store.getWorkflow(started.workflowId);
  });

  it("a journaled allow entry the current grant only overlaps refuses the resume at the parent (S004-317)", () => {
    expect(overlapping).toBeInstanceOf(WorkflowBoundaryError);
    const e = overlapping as WorkflowBoundaryError;
    expect(e.context.subject).toBe("parent");
    expect(String(e.context.reason)).toMatch(/^tools/);
  });

  it("the boundary of the parent and of each node is awaited in turn before any work (S004-326)", () => {
    expect(asked).toEqual(["parent", "ok", "flaky"]);
    expect(ranAfter).toBe(ranBefore);
  });

  it("one refused boundary refuses the whole resume: nothing ran, the journal and the row are as they were (S004-327)", () => {
    expect(hooked).toMatchObject({ code: "boundary_refused", context: { subject: "flaky" } });
    expect(journalAfter).toEqual(journalBefore);
    expect(row?.status).toBe("failed");
    expect(row?.recovery.workflowGeneration).toBe(1);
  });

  it("the boundary hook answers a promise of ok and a reason, and the refusal carries that reason (S004-325)", () => {
    expect(String((hooked as WorkflowBoundaryError).message)).toContain("node boundary moved");
  });
});
