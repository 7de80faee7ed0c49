import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  type NodeDispatcher,
  type NodeRunResult,
  parseWorkflowDefinition,
  type RecoveryContinueNode,
} from "../src/index.js";
import { closeEnginesAfterEach, deferred, taskLine, until, workflowJournal, world } from "./helpers.js";

/**
 * A waiting node's wake, each fence on its own: the generation, the held node, its wait id and claim
 * version, and the admission version. A refused wake starts nothing; an accepted one continues the node once.
 */
const db = useTestDatabase();
const all = closeEnginesAfterEach();

const def = parseWorkflowDefinition(`
name: parked
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);

/** A workflow whose node a parks on prerequisite {w-1, 2}; b waits for it. */
async function parked() {
  const w = await world(db.pool);
  const { engine } = await w.engine(({ task }) => `done ${taskLine(task)}`, {
    wrap: (base): NodeDispatcher => ({
      createChild: (r) => base.createChild(r),
      runNode: async (r) =>
        r.nodeId === "a"
          ? ({ status: "waiting", prerequisite: { waitId: "w-1", claimVersion: 2 } } as NodeRunResult)
          : base.runNode(r),
      continueNode: (r, host) => base.continueNode(r, host),
    }),
  });
  all.push(engine);
  const ctx = w.ctx();
  const started = await engine.start(ctx, { definition: def });
  const id = started.workflowId;
  await until(
    () => engine.run(id)?.journal.nodes.a?.status === "waiting" && engine.run(id)?.active.size === 0,
    "a waiting",
  );
  const continued: string[] = [];
  const continueNode: RecoveryContinueNode = async (input) => {
    continued.push(input.nodeId);
    return { status: "answered", reply: "a answered after its wake" };
  };
  const wake = {
    workflowId: id,
    parentSessionId: w.parentSessionId,
    toolCallId: ctx.toolCallId,
    workflowGeneration: 1,
    recoveryAdmissionVersion: 1,
    nodeId: "a",
    waitId: "w-1",
    claimVersion: 2,
    continueNode,
  };
  return { w, engine, id, wake, continued };
}

describe("a waiting node's wake", () => {
  it("each mismatch alone is refused (stale or not held) and starts nothing; the exact wake is accepted once", async () => {
    const { engine, id, wake, continued } = await parked();
    const answers = {
      generation: engine.resumeWaitingNode({ ...wake, workflowGeneration: 2 }),
      olderGeneration: engine.resumeWaitingNode({ ...wake, workflowGeneration: 0 }),
      waitId: engine.resumeWaitingNode({ ...wake, waitId: "w-2" }),
      claimVersion: engine.resumeWaitingNode({ ...wake, claimVersion: 3 }),
      olderAdmission: engine.resumeWaitingNode({ ...wake, recoveryAdmissionVersion: 0 }),
      notWaiting: engine.resumeWaitingNode({ ...wake, nodeId: "b" }),
      unknownNode: engine.resumeWaitingNode({ ...wake, nodeId: "zz" }),
    };
    expect(answers).toEqual({
      generation: { status: "stale" },
      olderGeneration: { status: "stale" },
      waitId: { status: "stale" },
      claimVersion: { status: "stale" },
      olderAdmission: { status: "stale" },
      notWaiting: { status: "not-held" },
      unknownNode: { status: "not-held" },
    });
    await new Promise((r) => setTimeout(r, 50));
    expect(continued).toEqual([]);
    expect(engine.run(id)?.active.size).toBe(0);
    expect(engine.run(id)?.journal.recovery.recoveryAdmissionVersion).toBe(1);
    expect(engine.resumeWaitingNode(wake)).toEqual({ status: "accepted" });
    // Accepted: reserved at once, so the same wake again finds the node not held.
    expect(engine.run(id)?.active.has("a")).toBe(true);
    expect(engine.resumeWaitingNode(wake)).toEqual({ status: "not-held" });
    expect((await engine.finished(id)).status).toBe("completed");
    expect(continued).toEqual(["a"]);
  });

  it("a wake while the node's earlier wake still runs is not held, even with the same wait id", async () => {
    const { engine, id, wake } = await parked();
    const gate = deferred();
    const slow: RecoveryContinueNode = async () => {
      await gate.promise;
      return { status: "answered", reply: "late" };
    };
    expect(engine.resumeWaitingNode({ ...wake, continueNode: slow })).toEqual({ status: "accepted" });
    // The node is still journaled waiting until its continuation is admitted: only `active` holds it.
    expect(engine.resumeWaitingNode({ ...wake, recoveryAdmissionVersion: 2 })).toEqual({
      status: "not-held",
    });
    gate.resolve();
    expect((await engine.finished(id)).status).toBe("completed");
  });

  it("a newer admission version is adopted and journaled; the generation stays", async () => {
    const { engine, id, wake, continued } = await parked();
    expect(engine.resumeWaitingNode({ ...wake, recoveryAdmissionVersion: 4 })).toEqual({
      status: "accepted",
    });
    expect(engine.run(id)?.journal.recovery).toEqual({ workflowGeneration: 1, recoveryAdmissionVersion: 4 });
    expect((await engine.finished(id)).status).toBe("completed");
    expect(continued).toEqual(["a"]);
    expect((await engine.store.getWorkflow(id))?.recovery.workflowGeneration).toBe(1);
  });

  it("a node whose journal says waiting but holds no prerequisite is not held", async () => {
    const { engine, id, wake, continued } = await parked();
    const node = engine.run(id)?.journal.nodes.a;
    if (node) delete node.waiting;
    expect(engine.resumeWaitingNode(wake)).toEqual({ status: "not-held" });
    expect(continued).toEqual([]);
    expect((await workflowJournal(db.pool, id)).nodes.a?.waiting).toEqual({ waitId: "w-1", claimVersion: 2 });
  });
});
