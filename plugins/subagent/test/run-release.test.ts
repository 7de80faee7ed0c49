import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { type NodeDispatcher, type NodeRunResult, parseWorkflowDefinition } from "../src/index.js";
import {
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
 * A run's node lifecycle on a real database: each status change announced, dependents released only when
 * every dependency succeeded, an outcome settled once (a late one after a cancel changes nothing), and what
 * a cancel makes of each node.
 */
const db = useTestDatabase();
const all = closeEnginesAfterEach();

const journal = (workflowId: string) => workflowJournal(db.pool, workflowId);

/** A dispatcher whose fresh turns answer with `result(nodeId)` (the base dispatcher still makes the child). */
function answering(result: (nodeId: string, signal: AbortSignal) => Promise<NodeRunResult>) {
  return (base: NodeDispatcher): NodeDispatcher => ({
    createChild: (r) => base.createChild(r),
    runNode: (r) => result(r.nodeId, r.signal),
    continueNode: (r, host) => base.continueNode(r, host),
  });
}

describe("a node's status changes", () => {
  it("each one is announced with the workflow and node, in order: reserved, running, then its outcome", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: two
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);
    const { engine, events } = await w.engine(({ task }) => `done ${taskLine(task)}`);
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    expect((await engine.finished(started.workflowId)).status).toBe("completed");
    const nodes = events.filter((e) => e.type === "node");
    expect(nodes).toEqual([
      { type: "node", workflowId: started.workflowId, nodeId: "a", status: "reserved" },
      { type: "node", workflowId: started.workflowId, nodeId: "a", status: "running" },
      { type: "node", workflowId: started.workflowId, nodeId: "a", status: "succeeded" },
      { type: "node", workflowId: started.workflowId, nodeId: "b", status: "reserved" },
      { type: "node", workflowId: started.workflowId, nodeId: "b", status: "running" },
      { type: "node", workflowId: started.workflowId, nodeId: "b", status: "succeeded" },
    ]);
  });

  it("a failed outcome's own code and message become the node's error; an empty one fails with its own code", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: outcomes
nodes:
  - { id: f, task: "TASK f" }
  - { id: e, task: "TASK e" }
  - { id: after, task: "TASK after", dependsOn: [f] }
`);
    const { engine } = await w.engine(() => "unused", {
      wrap: answering(async (nodeId) =>
        nodeId === "f"
          ? { status: "failed", error: { code: "host_said_no", message: "the host refused the turn" } }
          : { status: "empty" },
      ),
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    const run = engine.run(started.workflowId);
    expect((await engine.finished(started.workflowId)).status).toBe("failed");
    const nodes = run?.journal.nodes;
    expect(nodes?.f?.status).toBe("failed");
    expect(nodes?.f?.error).toEqual({ code: "host_said_no", message: "the host refused the turn" });
    expect(nodes?.e?.status).toBe("failed");
    expect(nodes?.e?.error).toEqual({
      code: "empty_continuation",
      message: "the node's child had no transcript to continue and no task was given",
    });
    expect(nodes?.after?.status).toBe("blocked");
    expect(nodes?.after?.error).toEqual({ code: "dependency_failed", message: "dependency f failed" });
    // The failed workflow keeps its journal, as the run last wrote it.
    const stored = await journal(started.workflowId);
    expect(stored.nodes.f?.error).toEqual(nodes?.f?.error);
    expect(stored.nodes.after?.status).toBe("blocked");
  });
});

describe("dependents released", () => {
  it("a node with two dependencies starts once, only after both succeeded, with both handovers", {
    timeout: 60_000,
  }, async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: join
nodes:
  - { id: b, task: "TASK b" }
  - { id: c, task: "TASK c" }
  - { id: d, task: "TASK d", dependsOn: [b, c] }
`);
    const gates = { b: deferred(), c: deferred() };
    const tasks: string[] = [];
    const { engine } = await w.engine(async ({ task }) => {
      const line = taskLine(task);
      tasks.push(task);
      if (line === "TASK b") await gates.b.promise;
      if (line === "TASK c") await gates.c.promise;
      return `answer of ${line}`;
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    try {
      const id = started.workflowId;
      await until(() => tasks.length === 2, "b and c running", 20_000);
      gates.b.resolve();
      await until(async () => (await journal(id)).nodes.b?.status === "succeeded", "b succeeded", 20_000);
      // One dependency is not enough: d stays pending while c runs.
      await new Promise((r) => setTimeout(r, 100));
      expect((await journal(id)).nodes.d?.status).toBe("pending");
      expect(engine.run(id)?.journal.nodes.d?.status).toBe("pending");
      expect(tasks.map(taskLine).sort()).toEqual(["TASK b", "TASK c"]);
      gates.c.resolve();
      expect((await engine.finished(id)).status).toBe("completed");
      expect(tasks.map(taskLine).slice(2)).toEqual(["TASK d"]);
      const dTask = tasks[2] as string;
      expect(dTask).toContain("answer of TASK b");
      expect(dTask).toContain("answer of TASK c");
    } finally {
      gates.b.resolve();
      gates.c.resolve();
    }
  });

  it("a dependency that ends without success blocks its dependents, and theirs in turn, naming the cause", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: cascade
nodes:
  - { id: a, task: "TASK a", outputSchema: { type: object, required: [ok] } }
  - { id: b, task: "TASK b", dependsOn: [a] }
  - { id: c, task: "TASK c", dependsOn: [b] }
  - { id: d, task: "TASK d", dependsOn: [a, free] }
  - { id: free, task: "TASK free" }
`);
    const ran: string[] = [];
    const { engine, events } = await w.engine(({ task }) => {
      ran.push(taskLine(task));
      return "not json";
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    const run = engine.run(started.workflowId);
    expect((await engine.finished(started.workflowId)).status).toBe("failed");
    expect(ran.sort()).toEqual(["TASK a", "TASK free"]);
    const n = run?.journal.nodes;
    expect(n?.a?.error?.code).toBe("output_schema");
    expect(n?.b).toMatchObject({
      status: "blocked",
      error: { code: "dependency_failed", message: "dependency a failed" },
    });
    expect(n?.c).toMatchObject({
      status: "blocked",
      error: { code: "dependency_failed", message: "dependency b blocked" },
    });
    expect(n?.d).toMatchObject({ status: "blocked", error: { message: "dependency a failed" } });
    expect(n?.free?.status).toBe("succeeded");
    const blocked = events.filter((e) => e.type === "node" && e.status === "blocked");
    expect(blocked.map((e) => e.type === "node" && e.nodeId).sort()).toEqual(["b", "c", "d"]);
  });
});

describe("a cancel", () => {
  it("interrupts a started node, cancels what never started, and a late answer changes nothing", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: stop
nodes:
  - { id: slow, task: "TASK slow" }
  - { id: next, task: "TASK next", dependsOn: [slow] }
`);
    const late = deferred<NodeRunResult>();
    const { engine } = await w.engine(() => "unused", {
      wrap: answering(async (_nodeId, signal) => {
        // Ignores its abort: its answer arrives after the cancel.
        signal.addEventListener("abort", () =>
          setTimeout(() => late.resolve({ status: "answered", reply: "late" }), 50),
        );
        return late.promise;
      }),
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    const id = started.workflowId;
    await until(() => engine.run(id)?.started.has("slow") === true, "slow running");
    const run = engine.run(id);
    const outcome = await engine.cancel(id, w.accountId);
    expect(outcome.status).toBe("cancelled");
    await late.promise;
    await new Promise((r) => setTimeout(r, 50));
    expect(run?.journal.nodes.slow?.status).toBe("interrupted");
    expect(run?.journal.nodes.next?.status).toBe("cancelled");
    expect(outcome.summary?.split("\n").slice(1)).toEqual([
      "- slow: interrupted while running",
      "- next: cancelled before it started",
    ]);
    expect((await summaries(db.pool, w.parentSessionId)).map((s) => s.body)).toEqual([outcome.summary]);
    expect((await journal(id)).nodes.slow?.status).toBe("interrupted");
  });

  it("a node that was running before a boot is interrupted by a cancel, not cancelled", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: boot-stop
nodes:
  - { id: a, task: "TASK a" }
`);
    const first = await w.engine(({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: def });
    await until(() => first.engine.run(started.workflowId)?.started.has("a") === true, "a running");
    await first.engine.close();
    const hold = deferred();
    const second = await w.engine(() => "unused", {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        runNode: (r) => base.runNode(r),
        // The continuation has not begun its turn when the Stop arrives.
        continueNode: async (r) => {
          await hold.promise;
          return untilAborted(r.signal);
        },
      }),
    });
    all.push(second.engine);
    await second.engine.recoverInterrupted();
    await until(() => second.engine.run(started.workflowId)?.active.has("a") === true, "a continued");
    const cancelled = second.engine.cancel(started.workflowId, w.accountId);
    hold.resolve();
    const outcome = await cancelled;
    expect(outcome.status).toBe("cancelled");
    expect(outcome.summary).toContain("- a: interrupted while running");
  });
});

describe("a cancel before a node's turn starts", () => {
  it("a node whose child is still being made, or whose grants are still being minted, is cancelled, not interrupted", async () => {
    for (const where of ["child", "grants"] as const) {
      const w = await world(db.pool);
      const def = parseWorkflowDefinition(`
name: early-stop
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);
      const gate = deferred();
      const reached = deferred();
      const ran: string[] = [];
      const { engine } = await w.engine(
        ({ task }) => {
          ran.push(taskLine(task));
          return "never";
        },
        {
          wrap: (base): NodeDispatcher => ({
            createChild: async (r) => {
              if (where === "child") {
                reached.resolve();
                await gate.promise;
              }
              return base.createChild(r);
            },
            runNode: (r) => base.runNode(r),
            continueNode: (r, host) => base.continueNode(r, host),
          }),
        },
      );
      all.push(engine);
      if (where === "grants") {
        const grant = engine.artifacts.grantMany.bind(engine.artifacts);
        engine.artifacts.grantMany = async (...args) => {
          reached.resolve();
          await gate.promise;
          return grant(...args);
        };
      }
      const started = await engine.start(w.ctx(), { definition: def });
      await reached.promise;
      const status = engine.run(started.workflowId)?.journal.nodes.a?.status;
      expect(status).toBe(where === "child" ? "reserved" : "running");
      const cancelled = engine.cancel(started.workflowId, w.accountId);
      gate.resolve();
      const outcome = await cancelled;
      expect(outcome.status).toBe("cancelled");
      expect(outcome.summary?.split("\n").slice(1)).toEqual([
        "- a: cancelled before it started",
        "- b: cancelled before it started",
      ]);
      expect(ran).toEqual([]);
    }
  });

  it("a cancel while the workflow is already finishing changes nothing: the completed outcome stands", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: late-stop
nodes:
  - { id: a, task: "TASK a" }
`);
    const { engine } = await w.engine(({ task }) => `done ${taskLine(task)}`);
    all.push(engine);
    const gate = deferred();
    const finishing = deferred();
    const deliver = engine.store.deliverSummary.bind(engine.store);
    engine.store.deliverSummary = async (input) => {
      finishing.resolve();
      await gate.promise;
      return deliver(input);
    };
    const started = await engine.start(w.ctx(), { definition: def });
    await finishing.promise;
    const run = engine.run(started.workflowId);
    const cancelled = engine.cancel(started.workflowId, w.accountId);
    gate.resolve();
    const outcome = await cancelled;
    expect(outcome.status).toBe("completed");
    expect(run?.journal.cancelRequested).toBe(false);
    expect(run?.journal.nodes.a?.status).toBe("succeeded");
  });
});
