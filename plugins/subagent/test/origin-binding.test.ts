import { AsyncLocalStorage } from "node:async_hooks";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { hostAccessors, parseWorkflowDefinition } from "../src/index.js";
import { closeEnginesAfterEach, until, untilAborted, world } from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

describe("the live caller's origin binding", () => {
  it("the origin's completion sink and summary writer run in the origin's async context, whoever triggers the end (S004-427)", async () => {
    const als = new AsyncLocalStorage<string>();
    const seen: Array<{ what: string; context: string | undefined }> = [];
    const w = await world(db.pool);
    const { engine } = await w.engine(({ signal }) => untilAborted(signal));
    all.push(engine);
    const ctx = w.ctx(
      hostAccessors({
        completion: async () => {
          seen.push({ what: "completion", context: als.getStore() });
        },
        writer: async (summary) => {
          seen.push({ what: "writer", context: als.getStore() });
          return { body: summary, byteSize: Buffer.byteLength(summary) };
        },
      }),
    );
    const def = parseWorkflowDefinition('name: bound\nnodes:\n  - { id: a, task: "TASK a" }\n');
    const started = await als.run("origin call", () => engine.start(ctx, { definition: def }));
    await until(() => engine.run(started.workflowId)?.started.has("a") === true, "a running");
    // Another caller, in its own async context, stops the workflow: the origin's sinks still run as the origin.
    const outcome = await als.run("another caller", () => engine.cancel(started.workflowId, w.accountId));
    expect(outcome.status).toBe("cancelled");
    await until(() => seen.some((s) => s.what === "completion"), "completion told");
    expect(seen).toEqual([
      { what: "writer", context: "origin call" },
      { what: "completion", context: "origin call" },
    ]);
  });
});
