import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { parseWorkflowDefinition } from "../src/index.js";
import { closeEnginesAfterEach, until, untilAborted, world } from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

const one = parseWorkflowDefinition(`
name: fenced
nodes:
  - { id: a, task: "TASK a" }
`);

async function row(id: string) {
  const { rows } = await db.pool.query(
    "select published_count::int n, snapshot, locked_by from workflows where id = $1::uuid",
    [id],
  );
  return rows[0] as { n: number; snapshot: unknown; locked_by: string };
}

describe("snapshot publication fenced by owner", () => {
  it("a run whose row lease another owner took publishes nothing, even at the same generation", async () => {
    const w = await world(db.pool);
    const { engine, events } = await w.engine(({ signal }) => untilAborted(signal));
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: one });
    await until(() => engine.run(started.workflowId)?.started.has("a") === true, "a running");
    const run = engine.run(started.workflowId);
    if (!run) throw new Error("no run");
    // While it holds the lease, a publication is accepted.
    expect((await run.publish()).status).toBe("updated");
    const before = await row(started.workflowId);
    // Another owner holds the row now (same generation): this run's publication is refused.
    await db.pool.query("update workflows set locked_by = 'another-daemon' where id = $1::uuid", [
      started.workflowId,
    ]);
    expect((await run.publish()).status).toBe("stale");
    const after = await row(started.workflowId);
    expect(after).toEqual({ ...before, locked_by: "another-daemon" });
    expect(events.some((e) => e.type === "workflow")).toBe(false);
  });
});
