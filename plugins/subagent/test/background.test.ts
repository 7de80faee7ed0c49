import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { PgWorkflowStore, parseWorkflowDefinition, pgWorkflowEmitter } from "../src/index.js";
import { closeEnginesAfterEach, deferred, taskLine, until, world } from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

const def = parseWorkflowDefinition(
  "name: fg\nnodes: [{id: a, task: TASK a}, {id: b, task: TASK b, dependsOn: [a]}]",
);

describe("foreground waiter and Ctrl+B", () => {
  it("Ctrl+B of a session persists its workflow's background snapshot before the foreground waiter is released", async () => {
    const w = await world(db.pool);
    const gate = deferred();
    let completions = 0;
    const { engine } = await w.engine(
      async ({ task }) => {
        if (taskLine(task) === "TASK a") await gate.promise;
        return "ok";
      },
      {
        onCompletion: async () => {
          completions++;
        },
      },
    );
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    const run = engine.run(started.workflowId);
    run?.attachForeground();
    let snapshotWhenReleased: unknown;
    void run?.released.then(async () => {
      const { rows } = await db.pool.query("select snapshot from workflows where id = $1::uuid", [
        started.workflowId,
      ]);
      snapshotWhenReleased = rows[0].snapshot;
    });
    expect(await engine.moveForegroundOf(w.parentSessionId, w.accountId)).toEqual([
      { workflowId: started.workflowId, moved: { ok: true } },
    ]);
    await until(() => snapshotWhenReleased !== undefined, "released");
    expect(snapshotWhenReleased).toMatchObject({ background: true, status: "running" });
    gate.resolve();
    await engine.finished(started.workflowId);
    expect(completions).toBe(1); // backgrounded: the summary goes through the completion path
  });

  it("a failed background snapshot write is diagnosed and leaves the waiter attached (S004-280)", async () => {
    const w = await world(db.pool);
    const gate = deferred();
    const inner = pgWorkflowEmitter(new PgWorkflowStore(db.pool));
    let completions = 0;
    const { engine, events } = await w.engine(
      async ({ task }) => {
        if (taskLine(task) === "TASK a") await gate.promise;
        return "ok";
      },
      {
        emitter: async (u, expected) => {
          if (u.snapshot.background) throw new Error("disk full");
          return inner(u, expected);
        },
        onCompletion: async () => {
          completions++;
        },
      },
    );
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    const run = engine.run(started.workflowId);
    run?.attachForeground();
    let released = false;
    void run?.released.then(() => {
      released = true;
    });
    expect(await engine.moveForegroundOf(w.parentSessionId, w.accountId)).toEqual([
      { workflowId: started.workflowId, moved: { ok: false, reason: "disk full" } },
    ]);
    expect(events.some((e) => e.type === "background_failed" && e.error.message === "disk full")).toBe(true);
    gate.resolve();
    const outcome = await engine.finished(started.workflowId);
    expect(released).toBe(false);
    expect(outcome.status).toBe("completed");
    expect(completions).toBe(0); // still foreground: the waiter takes the summary as its result
    const { rows } = await db.pool.query("select snapshot from workflows where id = $1::uuid", [
      started.workflowId,
    ]);
    expect(rows[0].snapshot.background).toBeUndefined();
  });
});
