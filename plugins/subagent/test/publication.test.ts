import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import {
  type NodeDispatcher,
  PgWorkflowStore,
  parseWorkflowDefinition,
  pgWorkflowEmitter,
  readOrchestrationJournal,
  type WorkflowEmitter,
  type WorkflowUpdate,
} from "../src/index.js";
import {
  closeEnginesAfterEach,
  deferred,
  summaries,
  taskLine,
  until,
  untilAborted,
  world,
} from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

const two = parseWorkflowDefinition(`
name: pub
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);

type Call = { expected: number | undefined; status: string; result?: string; nodes: string };

function recording(
  store: PgWorkflowStore,
  calls: Call[],
  hook?: (call: Call, update: WorkflowUpdate) => Promise<void> | void,
): WorkflowEmitter {
  const inner = pgWorkflowEmitter(store);
  return async (update, expected) => {
    const call: Call = {
      expected,
      status: update.status,
      nodes: update.snapshot.nodes.map((n) => `${n.id}:${n.status}`).join(","),
    };
    calls.push(call);
    await hook?.(call, update);
    const result = await inner(update, expected);
    call.result = result.status;
    return result;
  };
}

describe("awaited publication with generations", () => {
  it("a created result without a recovery proof throws, and nothing runs (S004-406)", async () => {
    const w = await world(db.pool);
    class NoProof extends PgWorkflowStore {
      override async recoverableWorkflow() {
        return null;
      }
    }
    let ran = 0;
    const { engine } = await w.engine(
      () => {
        ran++;
        return "x";
      },
      { emitter: pgWorkflowEmitter(new NoProof(db.pool)) },
    );
    all.push(engine);
    await expect(engine.start(w.ctx(), { definition: two })).rejects.toMatchObject({
      code: "missing_recovery_proof",
    });
    expect(ran).toBe(0);
  });

  it("a Stop before the first created receipt is queued under the expected generation and publishes after it (S004-413 S004-408)", async () => {
    const w = await world(db.pool);
    const store = new PgWorkflowStore(db.pool);
    const calls: Call[] = [];
    const hold = deferred();
    const sawCreate = deferred<void>();
    let ran = 0;
    let workflowId = "";
    const { engine } = await w.engine(
      () => {
        ran++;
        return "x";
      },
      {
        emitter: recording(store, calls, async (call) => {
          if (call.expected === undefined) {
            sawCreate.resolve();
            await hold.promise;
          }
        }),
        onEvent: () => {},
      },
    );
    all.push(engine);
    const starting = engine.start(w.ctx(), { definition: two });
    await sawCreate.promise;
    const { rows } = await db.pool.query(
      "select count(*)::int n from workflows where parent_session_id = $1::uuid",
      [w.parentSessionId],
    );
    expect(rows[0].n).toBe(0); // the native insert has not happened yet
    // The run is registered before its first receipt.
    workflowId = engine.runIds()[0] as string;
    const cancelling = engine.cancel(workflowId, w.accountId);
    hold.resolve();
    const started = await starting;
    expect(started.workflowId).toBe(workflowId);
    const outcome = await cancelling;
    expect(outcome.status).toBe("cancelled");
    expect(ran).toBe(0);
    expect(calls[0]).toMatchObject({ expected: undefined, result: "created" });
    expect(calls[1]).toMatchObject({
      expected: 1,
      result: "updated",
      status: "cancelled",
      nodes: "a:cancelled,b:cancelled",
    });
    expect(outcome.summary).toContain("- a: cancelled before it started");
  });

  it("a refused (stale) write publishes nothing and never releases the node (S004-410 S004-411)", async () => {
    const w = await world(db.pool);
    const store = new PgWorkflowStore(db.pool);
    const calls: Call[] = [];
    let children = 0;
    const { engine } = await w.engine(() => "never", {
      emitter: recording(store, calls, async (call, u) => {
        if (call.expected !== undefined) {
          // Another request advanced the generation before this write.
          await db.pool.query("update workflows set generation = generation + 1 where id = $1::uuid", [
            u.workflowId,
          ]);
        }
      }),
      wrap: (base): NodeDispatcher => ({
        createChild: async (r) => {
          children++;
          return base.createChild(r);
        },
        runNode: (r) => base.runNode(r),
        continueNode: (r, host) => base.continueNode(r, host),
      }),
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: two });
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBeNull();
    expect(calls[1]).toMatchObject({ expected: 1, result: "stale" });
    expect(children).toBe(0);
    const { rows } = await db.pool.query(
      "select snapshot, published_count from workflows where id = $1::uuid",
      [started.workflowId],
    );
    expect(rows[0].published_count).toBe(1); // only the created snapshot
    expect(rows[0].snapshot.nodes.map((n: { status: string }) => n.status)).toEqual(["pending", "pending"]);
    expect(await summaries(db.pool, w.parentSessionId)).toEqual([]);
  });

  it("a stale terminal cancellation cannot publish completion over a newer explicit resume (S004-415 S004-390)", async () => {
    const w = await world(db.pool);
    const store = new PgWorkflowStore(db.pool);
    const afterTerminal = deferred();
    const resumed = deferred();
    const calls: Call[] = [];
    const inner = recording(store, calls);
    let completions = 0;
    const a = await w.engine(async ({ signal }) => untilAborted(signal), {
      emitter: async (update, expected) => {
        const result = await inner(update, expected);
        if (update.status === "cancelled") {
          afterTerminal.resolve();
          await resumed.promise; // the old run's completion is still to come when the resume lands
        }
        return result;
      },
      onCompletion: async () => {
        completions++;
      },
    });
    all.push(a.engine);
    const ctx = w.ctx();
    const started = await a.engine.start(ctx, { definition: two });
    await until(
      async () =>
        (await store.getWorkflow(started.workflowId))?.snapshot !== undefined &&
        a.engine.run(started.workflowId)?.started.size === 1,
      "a running",
    );
    const cancelled = a.engine.cancel(started.workflowId, w.accountId);
    await afterTerminal.promise;
    const b = await w.engine(({ task }) => `resumed ${taskLine(task)}`);
    all.push(b.engine);
    // The host's terminal-to-running bridge, as the resume calls it.
    const bridged: Array<{ workflowId: string; toolCallId: string }> = [];
    const advance = b.engine.store.advanceWorkflowGeneration.bind(b.engine.store);
    b.engine.store.advanceWorkflowGeneration = async (input) => {
      bridged.push({ workflowId: input.workflowId, toolCallId: input.toolCallId });
      return advance(input);
    };
    await b.engine.resume({ ...ctx, toolCallId: "resume-call" }, started.workflowId);
    expect(bridged).toEqual([{ workflowId: started.workflowId, toolCallId: ctx.toolCallId }]);
    resumed.resolve();
    const old = await cancelled;
    expect(old.status).toBeNull(); // superseded: no completion from the old run
    const fresh = await b.engine.finished(started.workflowId);
    expect(fresh.status).toBe("completed");
    expect(completions).toBe(0);
    const results = await summaries(db.pool, w.parentSessionId);
    expect(results).toHaveLength(1);
    expect(results[0]?.body).toContain("completed, run 2");
    expect((await store.getWorkflow(started.workflowId))?.recovery.workflowGeneration).toBe(2);
  });
});

/** A two-node workflow run to the end, each emitter call recorded and the journal read as the first child is made. */
describe("the publication of a workflow run", () => {
  const calls: Call[] = [];
  const journalAtFirstChild: unknown[] = [];
  let status: string | null;
  beforeAll(async () => {
    const w = await world(db.pool);
    const store = new PgWorkflowStore(db.pool);
    const { engine } = await w.engine(({ task }) => `ok ${taskLine(task)}`, {
      emitter: recording(store, calls),
      wrap: (base): NodeDispatcher => ({
        ...base,
        createChild: async (req) => {
          journalAtFirstChild.push(await store.readJournal(req.workflowId));
          return base.createChild(req);
        },
        runNode: (r) => base.runNode(r),
        continueNode: (r, host) => base.continueNode(r, host),
      }),
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: two });
    status = (await engine.finished(started.workflowId)).status;
  });

  it("the emitter answers created, then updated for every fenced write (S004-402)", () => {
    expect(status).toBe("completed");
    expect(calls[0]?.result).toBe("created");
    expect(calls.length).toBeGreaterThan(2);
    expect(calls.slice(1).map((c) => c.result)).toEqual(calls.slice(1).map(() => "updated"));
  });

  it("only the first write, the native insert, omits the expected generation (S004-405)", () => {
    expect(calls[0]?.expected).toBeUndefined();
    expect(calls.slice(1).every((c) => c.expected === 1)).toBe(true);
  });

  it("the created proof is journaled before a node is prepared: the first child's journal holds it, and the reservation was published first (S004-407)", () => {
    const first = readOrchestrationJournal(journalAtFirstChild[0]);
    expect(first.ok && first.journal.recovery).toEqual({
      workflowGeneration: 1,
      recoveryAdmissionVersion: 1,
    });
    expect(calls[1]?.nodes).toBe("a:reserved,b:pending");
  });

  it("the terminal update is accepted as updated like any fenced one (S004-409)", () => {
    expect(calls.at(-1)).toMatchObject({ status: "completed", result: "updated", expected: 1 });
  });
});
