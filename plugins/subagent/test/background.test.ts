import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  PgWorkflowStore,
  parseWorkflowDefinition,
  pgWorkflowEmitter,
  type WorkflowEmitter,
} from "../src/index.js";
import { closeEnginesAfterEach, deferred, taskLine, until, untilAborted, world } from "./helpers.js";

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

  it("a run no foreground waiter waits on is not moved: Ctrl+B says so and publishes nothing", async () => {
    const w = await world(db.pool);
    const backgrounds: unknown[] = [];
    const inner = pgWorkflowEmitter(new PgWorkflowStore(db.pool));
    const { engine } = await w.engine(({ signal }) => untilAborted(signal), {
      emitter: async (u, expected) => {
        if (u.snapshot.background) backgrounds.push(u.snapshot);
        return inner(u, expected);
      },
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    const run = engine.run(started.workflowId);
    expect(await run?.moveToBackground()).toEqual({ ok: false, reason: "no foreground waiter is attached" });
    expect(backgrounds).toEqual([]);
  });

  it("a second Ctrl+B while the first one's snapshot is being written answers at once and writes no second one", async () => {
    const w = await world(db.pool);
    const inner = pgWorkflowEmitter(new PgWorkflowStore(db.pool));
    const writing = deferred();
    const hold = deferred();
    let backgrounds = 0;
    const emitter: WorkflowEmitter = async (u, expected) => {
      if (u.snapshot.background) {
        backgrounds++;
        writing.resolve();
        await hold.promise;
      }
      return inner(u, expected);
    };
    const { engine } = await w.engine(({ signal }) => untilAborted(signal), { emitter });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    const run = engine.run(started.workflowId);
    run?.attachForeground();
    const first = run?.moveToBackground();
    await writing.promise;
    // A second write would queue behind the held one: this answer does not wait for it.
    let answered: unknown;
    void run?.moveToBackground().then((r) => {
      answered = r;
    });
    await new Promise((r) => setTimeout(r, 100));
    expect(answered).toEqual({ ok: true });
    expect(backgrounds).toBe(1);
    hold.resolve();
    expect(await first).toEqual({ ok: true });
  });

  it("a run that is ending is not moved, whether it is finishing its cancel or was let go", async () => {
    const w = await world(db.pool);
    const hold = deferred();
    const { engine } = await w.engine(async () => {
      await hold.promise;
      throw new Error("stopped");
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    const run = engine.run(started.workflowId);
    await until(() => run?.started.has("a") === true, "a running");
    run?.attachForeground();
    // The cancel waits for a's execution, which the dispatcher holds: the run is finishing, not stopped.
    const cancelled = engine.cancel(started.workflowId, w.accountId);
    expect(run?.stopped).toBe(false);
    expect(await run?.moveToBackground()).toEqual({ ok: false, reason: "the workflow is ending" });
    hold.resolve();
    await cancelled;

    const other = await engine.start(w.ctx(), { definition: def });
    const letGo = engine.run(other.workflowId);
    letGo?.attachForeground();
    letGo?.abandon("closing");
    expect(await letGo?.moveToBackground()).toEqual({ ok: false, reason: "the workflow is ending" });
  });

  it("a background snapshot refused as stale is diagnosed: the waiter stays and the run stops", async () => {
    const w = await world(db.pool);
    const inner = pgWorkflowEmitter(new PgWorkflowStore(db.pool));
    const { engine, events } = await w.engine(({ signal }) => untilAborted(signal), {
      emitter: async (u, expected) => (u.snapshot.background ? { status: "stale" } : inner(u, expected)),
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    const run = engine.run(started.workflowId);
    run?.attachForeground();
    const reason = "the background snapshot was refused (stale)";
    expect(await run?.moveToBackground()).toEqual({ ok: false, reason });
    expect(events.find((e) => e.type === "background_failed")).toMatchObject({
      workflowId: started.workflowId,
      error: { message: reason },
    });
    expect(run?.waitedOn).toBe(true);
    expect(run?.stopped).toBe(true);
  });
});
