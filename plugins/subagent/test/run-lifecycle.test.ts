import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { type NodeDispatcher, parseWorkflowDefinition } from "../src/index.js";
import { closeEnginesAfterEach, deferred, taskLine, until, untilAborted, world } from "./helpers.js";

/**
 * A run on a real database: a node's outcome is published as soon as it is written (not only with the
 * next node's), a turn given up without a Stop leaves its node running, a run the engine let go of starts
 * nothing more, and a summary handoff that throws is reported as the run lost (on completion and on a
 * cancel), never left unanswered.
 */
const db = useTestDatabase();
const all = closeEnginesAfterEach();

const twoFree = parseWorkflowDefinition(`
name: two-free
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b" }
`);

const snapshotStatuses = async (workflowId: string) => {
  const { rows } = await db.pool.query("select snapshot from workflows where id = $1::uuid", [workflowId]);
  const nodes = (rows[0]?.snapshot?.nodes ?? []) as Array<{ id: string; status: string }>;
  return Object.fromEntries(nodes.map((n) => [n.id, n.status]));
};

describe("a node's outcome", () => {
  it("is published once written, while another node still runs", async () => {
    const w = await world(db.pool);
    const gates = { "TASK a": deferred(), "TASK b": deferred() };
    const ran: string[] = [];
    const { engine } = await w.engine(async ({ task }) => {
      const line = taskLine(task) as keyof typeof gates;
      ran.push(line);
      await gates[line].promise;
      return `done ${line}`;
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: twoFree });
    const id = started.workflowId;
    try {
      await until(() => ran.length === 2, "both nodes running");
      // the dispatch's own publications have settled, and none of them holds a's outcome
      await new Promise((r) => setTimeout(r, 200));
      expect((await snapshotStatuses(id)).a).not.toBe("succeeded");
      gates["TASK a"].resolve();
      await until(async () => (await snapshotStatuses(id)).a === "succeeded", "a's outcome published", 5_000);
      // b is still running: the publication carried a's outcome, not the workflow's end
      expect((await snapshotStatuses(id)).b).toBe("running");
    } finally {
      gates["TASK a"].resolve();
      gates["TASK b"].resolve();
    }
    expect((await engine.finished(id)).status).toBe("completed");
  });
});

describe("an aborted turn without a cancel", () => {
  it("leaves its node running in the journal: only a cancel makes an aborted node interrupted", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(() => "unused", {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        // the runner gave the turn up on its own (its process letting go), not for this workflow's Stop
        runNode: async () => ({ status: "aborted" }),
        continueNode: (r, host) => base.continueNode(r, host),
      }),
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: twoFree });
    const run = engine.run(started.workflowId);
    await until(() => run?.active.size === 0 && run.started.size === 2, "both turns given up");
    expect(run?.journal.nodes.a?.status).toBe("running");
    expect(run?.journal.nodes.b?.status).toBe("running");
    expect(run?.journal.cancelRequested).toBe(false);
  });
});

describe("a run the engine let go of", () => {
  it("launches no node that the node cap held back once its running node ends", async () => {
    const w = await world(db.pool);
    const ran: string[] = [];
    const { engine } = await w.engine(
      ({ task, signal }) => {
        ran.push(taskLine(task));
        return untilAborted(signal);
      },
      { maxActiveNodes: 1 },
    );
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: twoFree });
    await until(() => ran.length === 1, "one node running");
    const run = engine.run(started.workflowId);
    expect(run?.journal.dispatches).toBe(1);
    await engine.close();
    await new Promise((r) => setTimeout(r, 200));
    expect(ran).toEqual(["TASK a"]);
    // the held-back node was neither reserved nor charged after the run let go
    expect(run?.journal.nodes.b?.status).toBe("pending");
    expect(run?.journal.dispatches).toBe(1);
    expect(engine.activeNodes()).toBe(0);
  });
});

describe("a summary handoff that throws", () => {
  for (const how of ["completes", "is cancelled"] as const) {
    it(`is reported as the run lost when the workflow ${how}`, async () => {
      const w = await world(db.pool);
      const { engine, events } = await w.engine(({ task, signal }) =>
        how === "completes" ? `done ${taskLine(task)}` : untilAborted(signal),
      );
      all.push(engine);
      engine.store.deliverSummary = async () => {
        throw new Error("the inbox is down");
      };
      const started = await engine.start(w.ctx(), { definition: twoFree });
      const id = started.workflowId;
      const outcome = engine.finished(id);
      if (how === "is cancelled") {
        await until(() => engine.run(id)?.started.size === 2, "both nodes running");
        await engine.cancel(id, w.accountId);
      }
      await until(() => events.some((e) => e.type === "run_lost"), "the run reported lost");
      const lost = events.find((e) => e.type === "run_lost");
      expect(lost).toMatchObject({ type: "run_lost", workflowId: id });
      expect(lost && "error" in lost && (lost.error as Error).message).toBe("the inbox is down");
      // the run let go: its outcome says nothing was delivered
      expect((await outcome).status).toBeNull();
    });
  }
});
