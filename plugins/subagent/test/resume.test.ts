import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import { type PgWorkflowStore, parseWorkflowDefinition, WorkflowBoundaryError } from "../src/index.js";
import { closeEnginesAfterEach, deferred, summaries, taskLine, workflowJournal, world } from "./helpers.js";

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
    expect(before.nodes.b).toMatchObject({
      status: "failed",
      error: { code: "dispatch_budget_exhausted", message: "the workflow may dispatch at most 1 nodes" },
    });
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
