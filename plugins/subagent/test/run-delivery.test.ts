import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { artifactContent } from "../src/engine/run.js";
import { type NodeDispatcher, parseWorkflowDefinition, type WorkflowEmitter } from "../src/index.js";
import {
  closeEnginesAfterEach,
  deferred,
  nativeEmitter,
  oneNodeDefinition,
  summaries,
  taskLine,
  until,
  world,
} from "./helpers.js";

/**
 * A workflow's end: the summary its parent gets says how it ended, the run stops driving it once delivered,
 * and a node's artifact lists the tool outputs its child referenced, for dependents to read.
 */
const db = useTestDatabase();
const all = closeEnginesAfterEach();
const published: WorkflowEmitter = (u, expected) => nativeEmitter(db.pool)(u, expected);

describe("a node's artifact", () => {
  it("is the answer alone when the child referenced no tool output", () => {
    expect(artifactContent("the answer", undefined)).toBe("the answer");
    expect(artifactContent("the answer", [])).toBe("the answer");
  });

  it("lists every tool output the child referenced, with each part it has and nothing for a part it lacks", () => {
    const text = artifactContent("the answer", [
      {
        toolName: "Delegate",
        toolCallId: "call-1",
        resultId: "r-1",
        childSessionId: "c-1",
        spillPath: "outputs/r-1.txt",
        byteSize: 120,
        isError: true,
      },
      { toolName: "Read", byteSize: 0 },
      { toolName: "Bash", isError: false },
    ]);
    expect(text).toBe(
      [
        "the answer",
        "",
        "## Tool outputs referenced by this node",
        "- Delegate, call call-1, result r-1, child c-1, output outputs/r-1.txt, 120 bytes, error",
        "- Read, 0 bytes",
        "- Bash",
        "",
      ].join("\n"),
    );
  });
});

describe("a workflow's summary", () => {
  it("of a workflow with a failed node says it failed, and the run stops once it is delivered", async () => {
    const w = await world(db.pool);
    const gate = deferred();
    const { engine, events } = await w.engine(
      async ({ task }) => {
        await gate.promise;
        return taskLine(task);
      },
      {
        wrap: (base): NodeDispatcher => ({
          createChild: (r) => base.createChild(r),
          runNode: async (r) =>
            r.nodeId === "b"
              ? { status: "failed", error: { code: "model_error", message: "the model refused" } }
              : base.runNode(r),
          continueNode: (r, host) => base.continueNode(r, host),
        }),
      },
    );
    all.push(engine);
    const def = parseWorkflowDefinition(
      'name: ends\nnodes:\n  - { id: a, task: "TASK a" }\n  - { id: b, task: "TASK b" }\n',
    );
    const started = await engine.start(w.ctx(), { definition: def });
    const run = engine.run(started.workflowId);
    expect(run?.stopped).toBe(false);
    gate.resolve();
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("failed");
    const [summary] = await summaries(db.pool, w.parentSessionId);
    expect(summary?.outcome).toBe("error");
    expect(summary?.body.split("\n")[0]).toBe(`Workflow "ends" (${started.workflowId}) failed, run 1.`);
    expect(summary?.body).toContain("- b: failed: the model refused");
    expect(run?.stopped).toBe(true);
    // the end is told once, with the result it delivered
    expect(events.filter((e) => e.type === "workflow" && e.workflowId === started.workflowId)).toEqual([
      { type: "workflow", workflowId: started.workflowId, status: "failed", resultId: summary?.id },
    ]);
  });

  it("of a cancelled workflow says it was cancelled", async () => {
    const w = await world(db.pool);
    const running = deferred();
    const { engine } = await w.engine(({ signal }) => {
      running.resolve();
      return new Promise<string>((_, reject) =>
        signal.addEventListener("abort", () => reject(new Error("aborted"))),
      );
    });
    all.push(engine);
    const def = parseWorkflowDefinition('name: stopped\nnodes:\n  - { id: a, task: "TASK a" }\n');
    const started = await engine.start(w.ctx(), { definition: def });
    await running.promise;
    await engine.cancel(started.workflowId, w.accountId);
    await until(async () => (await summaries(db.pool, w.parentSessionId)).length === 1, "the summary");
    const [summary] = await summaries(db.pool, w.parentSessionId);
    expect(summary?.body.split("\n")[0]).toBe(
      `Workflow "stopped" (${started.workflowId}) was cancelled, run 1.`,
    );
  });

  it("of a cancelled workflow waits for its nodes' executions to end before it is delivered", async () => {
    const w = await world(db.pool);
    const running = deferred();
    const ended = deferred<{ status: "aborted" }>();
    const { engine } = await w.engine(() => "unused", {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        // a turn that takes its time to wind down after the abort (a runner finishing its last write)
        runNode: () => {
          running.resolve();
          return ended.promise;
        },
        continueNode: (r, host) => base.continueNode(r, host),
      }),
    });
    all.push(engine);
    const def = parseWorkflowDefinition('name: winding\nnodes:\n  - { id: a, task: "TASK a" }\n');
    const started = await engine.start(w.ctx(), { definition: def });
    await running.promise;
    const cancelled = engine.cancel(started.workflowId, w.accountId);
    await new Promise((r) => setTimeout(r, 300));
    expect(await summaries(db.pool, w.parentSessionId)).toEqual([]);
    ended.resolve({ status: "aborted" });
    expect((await cancelled).status).toBe("cancelled");
    expect(await summaries(db.pool, w.parentSessionId)).toHaveLength(1);
  });

  it("is not delivered by a run whose terminal publication was refused as stale: a newer run owns the workflow", async () => {
    const w = await world(db.pool);
    const emitter: WorkflowEmitter = async (u, expected) =>
      u.status === "completed" ? { status: "stale" } : published(u, expected);
    const { engine, events } = await w.engine(() => "done", { emitter });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNodeDefinition });
    expect((await engine.finished(started.workflowId)).status).toBeNull();
    expect(events.some((e) => e.type === "stale")).toBe(true);
    expect(await summaries(db.pool, w.parentSessionId)).toEqual([]);
  });

  it("is not delivered by an engine closed while the last outcome was being published", async () => {
    const w = await world(db.pool);
    const publishing = deferred();
    const hold = deferred();
    const emitter: WorkflowEmitter = async (u, expected) => {
      if (u.status === "running" && u.snapshot.nodes.some((n) => n.status === "succeeded")) {
        publishing.resolve();
        await hold.promise;
      }
      return published(u, expected);
    };
    const { engine } = await w.engine(() => "done", { emitter });
    all.push(engine);
    await engine.start(w.ctx(), { definition: oneNodeDefinition });
    await publishing.promise;
    const closing = engine.close();
    hold.resolve();
    await closing;
    await new Promise((r) => setTimeout(r, 300));
    expect(await summaries(db.pool, w.parentSessionId)).toEqual([]);
  });

  it("whose handoff finds the workflow moved on to a newer generation is not delivered, and the run says it is stale", async () => {
    const w = await world(db.pool);
    // a newer admission takes the workflow right after this run's terminal publication
    const emitter: WorkflowEmitter = async (u, expected) => {
      const result = await published(u, expected);
      if (u.status === "completed")
        await db.pool.query("update workflows set generation = generation + 1 where id = $1::uuid", [
          u.workflowId,
        ]);
      return result;
    };
    const { engine, events } = await w.engine(() => "done", { emitter });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNodeDefinition });
    expect((await engine.finished(started.workflowId)).status).toBeNull();
    expect(events.filter((e) => e.type === "stale")).toEqual([
      { type: "stale", workflowId: started.workflowId, generation: 1 },
    ]);
    expect(await summaries(db.pool, w.parentSessionId)).toEqual([]);
  });
});
