import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import {
  type NodeDispatcher,
  type PgWorkflowStore,
  parseWorkflowDefinition,
  WorkflowBoundaryError,
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

async function failedOnce(w: Awaited<ReturnType<typeof world>>) {
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
  const ctx = w.ctx();
  const started = await engine.start(ctx, { definition: def });
  const outcome = await engine.finished(started.workflowId);
  expect(outcome.status).toBe("failed");
  return { engine, ctx, started, runs };
}

describe("explicit WorkflowResume", () => {
  it("S004-297: S004-298: S004-390: resume re-captures access, advances the generation and retries a failed node in its own child", async () => {
    const w = await world(db.pool);
    const { engine, ctx, started, runs } = await failedOnce(w);
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
          return ctx.currentAccess();
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
    const results = await summaries(db.pool, w.parentSessionId);
    expect(results.map((r) => r.outcome)).toEqual(["error", "ok"]);
    // One summary per tool call: the resumed run's answers the WorkflowResume call.
    const { rows: calls } = await db.pool.query(
      "select tool_call_id from delegation_results where parent_session_id = $1::uuid order by queue_seq",
      [w.parentSessionId],
    );
    expect(calls.map((r) => r.tool_call_id)).toEqual([ctx.toolCallId, "resume-call"]);
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

describe("waiting nodes", () => {
  it("S004-420: S004-421: S004-417: S004-418: S004-419: S004-347: S004-384: S004-387: S004-388: S004-400: a waiting node holds its dependents, others go on, and only the exact wake continues it", async () => {
    const w = await world(db.pool);
    const waitDef = parseWorkflowDefinition(`
name: waits
nodes:
  - { id: remote, task: "TASK remote" }
  - { id: after, task: "TASK after", dependsOn: [remote] }
  - { id: free, task: "TASK free" }
`);
    let continued = 0;
    const { engine, events } = await w.engine(({ task }) => `done ${taskLine(task)}`, {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        runNode: async (r) => {
          if (r.nodeId !== "remote") return base.runNode(r);
          // The computer is offline: the host committed a prerequisite; nothing ran.
          return { status: "waiting", prerequisite: { waitId: "wait-1", claimVersion: 3 } };
        },
        continueNode: (r, host) => {
          continued++;
          return base.continueNode(r, host);
        },
      }),
    });
    all.push(engine);
    const ctx = w.ctx();
    const started = await engine.start(ctx, { definition: waitDef });
    await until(
      async () =>
        (await journal(started.workflowId)).nodes.free?.status === "succeeded" &&
        (await journal(started.workflowId)).nodes.remote?.status === "waiting" &&
        // the run lets the node go only after its waiting state is committed
        engine.run(started.workflowId)?.active.has("remote") === false,
      "free done, remote waiting",
    );
    const j = await journal(started.workflowId);
    expect(j.nodes.after?.status).toBe("pending");
    expect(j.nodes.remote?.waiting).toEqual({ waitId: "wait-1", claimVersion: 3 });
    expect(events.some((e) => e.type === "workflow")).toBe(false);
    expect(await summaries(db.pool, w.parentSessionId)).toEqual([]);
    const wake = {
      workflowId: started.workflowId,
      parentSessionId: w.parentSessionId,
      toolCallId: ctx.toolCallId,
      workflowGeneration: 1,
      recoveryAdmissionVersion: 2,
      nodeId: "remote",
      waitId: "wait-1",
      claimVersion: 3,
    };
    expect(engine.resumeWaitingNode({ ...wake, claimVersion: 2 })).toEqual({ status: "stale" });
    expect(engine.resumeWaitingNode({ ...wake, waitId: "wait-0" })).toEqual({ status: "stale" });
    expect(engine.resumeWaitingNode({ ...wake, workflowGeneration: 2 })).toEqual({ status: "stale" });
    expect(engine.resumeWaitingNode({ ...wake, nodeId: "free" })).toEqual({ status: "not-held" });
    expect(engine.resumeWaitingNode({ ...wake, toolCallId: "other" })).toEqual({ status: "not-held" });
    expect(continued).toBe(0); // waiting is not empty: nothing fell back to a fresh dispatch
    // Without the live workflow control (another process's engine), the wake cannot reach the node.
    const elsewhere = await w.engine(() => "never");
    all.push(elsewhere.engine);
    expect(elsewhere.engine.resumeWaitingNode(wake)).toEqual({ status: "not-held" });
    const dispatchesBefore = engine.run(started.workflowId)?.journal.dispatches;
    expect(engine.resumeWaitingNode(wake)).toEqual({ status: "accepted" });
    // Acceptance queued only that node: no other node started, nothing charged.
    expect([...(engine.run(started.workflowId)?.active.keys() ?? [])]).toEqual(["remote"]);
    expect(engine.run(started.workflowId)?.journal.dispatches).toBe(dispatchesBefore);
    expect(engine.run(started.workflowId)?.journal.recovery).toEqual({
      workflowGeneration: 1,
      recoveryAdmissionVersion: 2,
    });
    // Reserved before yielding: a duplicate wake finds it no longer held.
    expect(engine.resumeWaitingNode(wake)).toEqual({ status: "not-held" });
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("completed");
    expect(continued).toBe(1);
    const row = await engine.store.getWorkflow(started.workflowId);
    expect(row?.recovery.workflowGeneration).toBe(1); // no generation invented
    expect(outcome.summary).toContain("- after: succeeded");
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
