import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { parseWorkflowDefinition } from "../src/index.js";
import {
  chainDefinition,
  closeEnginesAfterEach,
  oneNodeDefinition,
  taskLine,
  until,
  untilAborted,
  world,
} from "./helpers.js";

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

describe("a started workflow's journal", () => {
  it("bounds its dispatches at four times its nodes and a hundred more when the definition names no bound", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(({ signal }) => untilAborted(signal));
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: chainDefinition });
    expect(engine.run(started.workflowId)?.journal.definition.maxDispatches).toBe(2 * 4 + 100);
  });

  it("gives the default model to each node naming neither a model nor an agent type, the default agent type to each naming none, and pins the default type to the default model", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(({ signal }) => untilAborted(signal));
    all.push(engine);
    const def = parseWorkflowDefinition(`
name: defaults
defaults: { model: m-default, agentType: worker }
agentTypes:
  reviewer: { model: m-review }
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", model: m-own }
  - { id: c, task: "TASK c", agentType: reviewer }
`);
    const started = await engine.start(w.ctx(), { definition: def });
    const j = engine.run(started.workflowId)?.journal;
    const spec = (id: string) => {
      const s = j?.nodes[id]?.spec;
      return { model: s?.model, agentType: s?.agentType };
    };
    expect(spec("a")).toEqual({ model: "m-default", agentType: "worker" });
    expect(spec("b")).toEqual({ model: "m-own", agentType: "worker" });
    expect(spec("c")).toEqual({ model: undefined, agentType: "reviewer" });
    expect(j?.typeModelPins).toEqual({ worker: "m-default", reviewer: "m-review" });
    // a default agent type without a default model pins nothing
    const typeOnly = parseWorkflowDefinition(
      'name: type-only\ndefaults: { agentType: worker }\nnodes:\n  - { id: a, task: "TASK a" }\n',
    );
    const other = await engine.start(w.ctx(), { definition: typeOnly });
    expect(Object.keys(engine.run(other.workflowId)?.journal.typeModelPins ?? { none: 1 })).toEqual([]);
  });
});

describe("WorkflowAddNodes", () => {
  it("while the workflow is being cancelled is refused", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(({ signal }) => untilAborted(signal));
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNodeDefinition });
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
