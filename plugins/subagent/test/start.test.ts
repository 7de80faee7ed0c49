import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { parseWorkflowDefinition } from "../src/index.js";
import { chainDefinition, closeEnginesAfterEach, taskLine, until, untilAborted, world } from "./helpers.js";

/**
 * A workflow's start and WorkflowAddNodes on a real database: a start refused before anything is created, a
 * second start of one tool call answered with the workflow the first made, and nodes refused while the
 * workflow is being cancelled.
 */
const db = useTestDatabase();
const all = closeEnginesAfterEach();

const rowsOf = async (parentSessionId: string) =>
  (
    await db.pool.query("select id::text from workflows where parent_session_id = $1::uuid", [
      parentSessionId,
    ])
  ).rows.map((r) => r.id);

describe("a workflow's start", () => {
  it("whose origin's access names another account is refused, and nothing is created", async () => {
    const w = await world(db.pool);
    const other = await world(db.pool);
    const { engine } = await w.engine(() => "never");
    all.push(engine);
    const ctx = w.ctx({ access: { accountId: other.accountId } });
    await expect(engine.start(ctx, { definition: chainDefinition })).rejects.toMatchObject({
      code: "not_resumable",
      message: "the origin's access names another account",
    });
    expect(await rowsOf(w.parentSessionId)).toEqual([]);
  });

  it("a second time for the same tool call answers the first one's workflow and nodes, and runs nothing twice", async () => {
    const w = await world(db.pool);
    const ran: string[] = [];
    const { engine } = await w.engine(({ task, signal }) => {
      ran.push(taskLine(task));
      return untilAborted(signal);
    });
    all.push(engine);
    const ctx = w.ctx();
    const first = await engine.start(ctx, { definition: chainDefinition });
    expect(first).toMatchObject({ nodes: ["a", "b"], created: true });
    const again = await engine.start(ctx, { definition: chainDefinition });
    expect(again).toEqual({ workflowId: first.workflowId, nodes: ["a", "b"], created: false });
    expect(await rowsOf(w.parentSessionId)).toEqual([first.workflowId]);
    await until(() => ran.length > 0, "a running");
    await new Promise((r) => setTimeout(r, 100));
    expect(ran).toEqual(["TASK a"]);
  });
});

describe("WorkflowAddNodes", () => {
  it("while the workflow is being cancelled is refused", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(({ signal }) => untilAborted(signal));
    all.push(engine);
    const def = parseWorkflowDefinition('name: one\nnodes:\n  - { id: a, task: "TASK a" }\n');
    const started = await engine.start(w.ctx(), { definition: def });
    await until(() => engine.run(started.workflowId)?.started.has("a") === true, "a running");
    const cancelled = engine.cancel(started.workflowId, w.accountId);
    await expect(
      engine.addNodes({
        workflowId: started.workflowId,
        principalAccountId: w.accountId,
        nodes: [{ id: "b", task: "TASK b" }],
      }),
    ).rejects.toMatchObject({ code: "not_running", message: "the workflow is being cancelled" });
    expect((await cancelled).status).toBe("cancelled");
    expect(engine.run(started.workflowId)?.journal.order ?? ["a"]).toEqual(["a"]);
  });
});
