import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  type NodeDispatcher,
  type NodeState,
  parseWorkflowDefinition,
  type WorkflowOutcome,
} from "../src/index.js";
import {
  childMessages,
  closeEnginesAfterEach,
  deferred,
  summaries,
  taskLine,
  until,
  untilAborted,
  workflowJournal,
  world,
} from "./helpers.js";

/**
 * Explicit WorkflowResume past its boundary check: the generation advanced once (a racing resume is
 * refused), and what each node of the ended run becomes (kept, retried in its own child, or fresh).
 */
const db = useTestDatabase();
const all = closeEnginesAfterEach();

const journal = (workflowId: string) => workflowJournal(db.pool, workflowId);

const def = parseWorkflowDefinition(`
name: stopped
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
  - { id: c, task: "TASK c" }
`);

describe("explicit WorkflowResume of a cancelled workflow", () => {
  it("retries the interrupted node in its own child, starts the cancelled one fresh, keeps the succeeded one, and a racing resume is refused", async () => {
    const w = await world(db.pool);
    let stop = true;
    const runs: string[] = [];
    const { engine } = await w.engine(async ({ task, sessionId, signal }) => {
      runs.push(`${taskLine(task)}@${sessionId}`);
      if (taskLine(task) === "TASK a" && stop) return untilAborted(signal);
      return `done ${taskLine(task)}`;
    });
    all.push(engine);
    const ctx = w.ctx();
    const started = await engine.start(ctx, { definition: def });
    const id = started.workflowId;
    await until(
      async () =>
        engine.run(id)?.started.has("a") === true && (await journal(id)).nodes.c?.status === "succeeded",
      "a running, c done",
    );
    expect((await engine.cancel(id, w.accountId)).status).toBe("cancelled");
    const before = await journal(id);
    expect(before.nodes.a?.status).toBe("interrupted");
    expect(before.nodes.b?.status).toBe("cancelled");
    const childA = before.nodes.a?.childSessionId as string;
    stop = false;
    // The first resume is still checking its boundary when the second one advances the generation.
    const checking = deferred();
    const proceed = deferred();
    const slow = engine.resume(w.ctx({ toolCallId: "resume-1" }), id, async () => {
      checking.resolve();
      await proceed.promise;
      return { ok: true };
    });
    await checking.promise;
    const fast = engine.resume(w.ctx({ toolCallId: "resume-2" }), id);
    await fast;
    proceed.resolve();
    const results = await Promise.allSettled([slow, fast]);
    const refused = results.filter((r) => r.status === "rejected");
    expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(1);
    expect(refused).toHaveLength(1);
    expect((refused[0] as PromiseRejectedResult).reason).toMatchObject({
      code: "not_resumable",
      message: `workflow ${id} changed meanwhile`,
      context: { workflowId: id },
    });
    const run = engine.run(id);
    expect(run?.journal.cancelRequested).toBe(false);
    expect(run?.journal.run).toBe(2);
    expect(run?.journal.recovery.workflowGeneration).toBe(2);
    const outcome = await engine.finished(id);
    expect(outcome.status).toBe("completed");
    expect(outcome.summary?.split("\n")[0]).toBe(`Workflow "stopped" (${id}) completed, run 2.`);
    // a in its own child again, b fresh in a new child, c not again.
    expect(runs.filter((r) => r.startsWith("TASK a"))).toEqual([`TASK a@${childA}`, `TASK a@${childA}`]);
    expect(runs.filter((r) => r.startsWith("TASK b"))).toHaveLength(1);
    expect(runs.filter((r) => r.startsWith("TASK c"))).toHaveLength(1);
    expect(runs.find((r) => r.startsWith("TASK b"))).not.toContain(childA);
    const delivered = await summaries(db.pool, w.parentSessionId);
    expect(delivered.map((s) => s.outcome)).toEqual(["error", "ok"]);
    expect(new Set(delivered.map((s) => s.id)).size).toBe(2);
    expect(delivered[1]?.id).toBe(outcome.resultId);
  });

  it("the failed node and the node it blocked keep no error of the ended run once they succeed", async () => {
    const w = await world(db.pool);
    let fail = true;
    const retrying = deferred();
    const { engine } = await w.engine(
      ({ task }) => {
        if (taskLine(task) === "TASK a" && fail) throw new Error("provider down");
        return `done ${taskLine(task)}`;
      },
      {
        wrap: (base): NodeDispatcher => ({
          createChild: (r) => base.createChild(r),
          runNode: (r) => base.runNode(r),
          continueNode: async (r, host) => {
            await retrying.promise;
            return base.continueNode(r, host);
          },
        }),
      },
    );
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    const id = started.workflowId;
    expect((await engine.finished(id)).status).toBe("failed");
    const before = await journal(id);
    expect(before.nodes.a?.error?.message).toBe("provider down");
    expect(before.nodes.b?.error?.code).toBe("dependency_failed");
    fail = false;
    await engine.resume(w.ctx({ toolCallId: "resume" }), id);
    const run = engine.run(id);
    // The resume's own snapshot, published before the retry: a is running again, b pending, c kept.
    const { rows } = await db.pool.query("select snapshot from workflows where id = $1::uuid", [id]);
    expect(rows[0].snapshot.nodes.map((n: { id: string; status: string }) => `${n.id}:${n.status}`)).toEqual([
      "a:running",
      "b:pending",
      "c:succeeded",
    ]);
    retrying.resolve();
    expect((await engine.finished(id)).status).toBe("completed");
    for (const n of ["a", "b", "c"] as const) {
      expect(run?.journal.nodes[n]?.status).toBe("succeeded");
      expect(run?.journal.nodes[n]?.error).toBeUndefined();
    }
  });

  it("a node stopped after its child was made but before its turn began starts fresh in a new child on resume; its first child gets no turn", async () => {
    const w = await world(db.pool);
    const runs: string[] = [];
    const calls: string[] = [];
    const { engine } = await w.engine(
      ({ task, sessionId }) => {
        runs.push(`${taskLine(task)}@${sessionId}`);
        return `done ${taskLine(task)}`;
      },
      {
        wrap: (base): NodeDispatcher => ({
          createChild: (r) => {
            calls.push(`create:${r.nodeId}`);
            return base.createChild(r);
          },
          runNode: (r) => {
            calls.push(`run:${r.nodeId}@${r.childSessionId}`);
            return base.runNode(r);
          },
          continueNode: (r, host) => {
            calls.push(`continue:${r.nodeId}@${r.childSessionId}`);
            return base.continueNode(r, host);
          },
        }),
      },
    );
    all.push(engine);
    const single = parseWorkflowDefinition(`
name: early-stop
nodes:
  - { id: a, task: "TASK a" }
`);
    // The Stop arrives while a's grants are minted: its child is made and journaled running, its turn not begun.
    let stopped: Promise<WorkflowOutcome> | undefined;
    const stopSent = deferred();
    let storedAtStop: NodeState | undefined;
    const grant = engine.artifacts.grantMany.bind(engine.artifacts);
    engine.artifacts.grantMany = async (workflowId, ...rest) => {
      if (!stopped) {
        storedAtStop = (await journal(workflowId)).nodes.a;
        stopped = engine.cancel(workflowId, w.accountId);
        stopSent.resolve();
      }
      return grant(workflowId, ...rest);
    };
    const started = await engine.start(w.ctx(), { definition: single });
    const id = started.workflowId;
    await stopSent.promise;
    expect((await stopped)?.status).toBe("cancelled");
    expect(storedAtStop?.status).toBe("running");
    const firstChild = storedAtStop?.childSessionId as string;
    expect(firstChild).toBeTruthy();
    const before = await journal(id);
    expect(before.nodes.a?.status).toBe("cancelled");
    expect(before.nodes.a?.childSessionId).toBe(firstChild);
    expect(calls).toEqual(["create:a"]);
    await engine.resume(w.ctx({ toolCallId: "resume" }), id);
    const run = engine.run(id);
    expect((await engine.finished(id)).status).toBe("completed");
    // Fresh: a new child is made and runs the task; the first child is neither retried nor given the task.
    const secondChild = run?.journal.nodes.a?.childSessionId as string;
    expect(secondChild).toBeTruthy();
    expect(secondChild).not.toBe(firstChild);
    expect(calls).toEqual(["create:a", "create:a", `run:a@${secondChild}`]);
    expect(runs).toEqual([`TASK a@${secondChild}`]);
    expect(await childMessages(db.pool, firstChild)).toEqual([]);
  });
});
