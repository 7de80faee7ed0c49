import { randomUUID } from "node:crypto";
import { realpath } from "node:fs/promises";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import {
  type NodeDispatcher,
  PgWorkflowStore,
  parseWorkflowDefinition,
  pgWorkflowEmitter,
  SnapshotPublisher,
  type WorkflowEmitter,
  type WorkflowUpdate,
} from "../src/index.js";
import { closeEnginesAfterEach, deferred, until, untilAborted, workflowJournal, world } from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

function update(workflowId: string, label: string): WorkflowUpdate {
  return {
    workflowId,
    status: "running",
    snapshot: { workflowId, name: label, status: "running", run: 1, nodes: [{ id: "a", status: "pending" }] },
  };
}

describe("snapshot publication", () => {
  it("snapshots are captured immutably when queued and published one at a time, in order (S004-278 S004-408)", async () => {
    const emitted: Array<{ name: string; expected: number | undefined }> = [];
    const gates = [deferred(), deferred()];
    let inFlight = 0;
    let maxInFlight = 0;
    const publisher = new SnapshotPublisher(async (u, expected) => {
      inFlight++;
      maxInFlight = Math.max(maxInFlight, inFlight);
      await gates[emitted.length]?.promise;
      emitted.push({ name: u.snapshot.name, expected });
      inFlight--;
      return { status: "updated" };
    });
    const id = randomUUID();
    const first = update(id, "first");
    let generation = 1;
    const p1 = publisher.queue(first, generation);
    generation = 2; // what the run knows later does not change what was queued
    const p2 = publisher.queue(update(id, "second"), generation);
    (first.snapshot as { name: string }).name = "mutated after queueing";
    gates[0]?.resolve();
    gates[1]?.resolve();
    await Promise.all([p1, p2]);
    expect(emitted).toEqual([
      { name: "first", expected: 1 },
      { name: "second", expected: 2 },
    ]);
    expect(maxInFlight).toBe(1);
  });

  it("the emitter's optional forwarding is awaited and sees the same result; a stale write forwards nothing", async () => {
    const w = await world(db.pool);
    const store = new PgWorkflowStore(db.pool);
    const forwarded: Array<{ status: string; done: boolean }> = [];
    const emit = pgWorkflowEmitter(store, async (_u, result) => {
      const entry = { status: result.status, done: false };
      forwarded.push(entry);
      await new Promise((r) => setTimeout(r, 10));
      entry.done = true;
    });
    const id = randomUUID();
    const created = await emit(
      {
        ...update(id, "fwd"),
        create: {
          parentSessionId: w.parentSessionId,
          principalAccountId: w.accountId,
          toolCallId: "c",
          owner: "o",
        },
      },
      undefined,
    );
    expect(created).toMatchObject({
      status: "created",
      recovery: { workflowGeneration: 1, recoveryAdmissionVersion: 1 },
    });
    expect(forwarded).toEqual([{ status: "created", done: true }]);
    expect(await emit(update(id, "fwd"), 1)).toEqual({ status: "updated" });
    expect(await emit(update(id, "fwd"), 7)).toEqual({ status: "stale" });
    expect(forwarded.map((f) => f.status)).toEqual(["created", "updated"]);
  });

  it("boot publishes through the same emitter contract, and a fresh reservation is published before the node's access is prepared (S004-404)", async () => {
    const w = await world(db.pool);
    const store = new PgWorkflowStore(db.pool);
    const inner = pgWorkflowEmitter(store);
    const first = await w.engine(async ({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const def = parseWorkflowDefinition(
      "name: boot\nnodes: [{id: a, task: t}, {id: b, task: u, dependsOn: [a]}]",
    );
    const started = await first.engine.start(w.ctx(), { definition: def });
    await until(() => first.engine.run(started.workflowId)?.started.has("a") === true, "a running");
    await first.engine.close();
    const calls: Array<{ expected: number | undefined; nodes: string; accessPrepared: boolean }> = [];
    const recording: WorkflowEmitter = async (u, expected) => {
      const stored = (await new PgWorkflowStore(db.pool).readJournal(u.workflowId)) as {
        nodeAccess: Record<string, string>;
      };
      calls.push({
        expected,
        nodes: u.snapshot.nodes.map((n) => `${n.id}:${n.status}`).join(","),
        accessPrepared: Boolean(stored.nodeAccess.b),
      });
      return inner(u, expected);
    };
    const second = await w.engine(() => "ok", { emitter: recording });
    all.push(second.engine);
    await second.engine.recoverInterrupted();
    await second.engine.finished(started.workflowId);
    expect(calls[0]).toMatchObject({ expected: 1, nodes: "a:running,b:pending" });
    const reservation = calls.find((c) => c.nodes === "a:succeeded,b:reserved");
    expect(reservation).toMatchObject({ expected: 1, accessPrepared: false });
    expect(calls.every((c) => c.expected === 1)).toBe(true);
  });

  it("a fresh reservation is journaled and its snapshot published before the node's placement, model and child are prepared (S004-423)", async () => {
    const project = await realpath(scratchDir("crw-proj-"));
    const w = await world(db.pool);
    const inner = pgWorkflowEmitter(new PgWorkflowStore(db.pool));
    const log: string[] = [];
    const { engine } = await w.engine(() => "ok", {
      emitter: async (u, expected) => {
        const b = u.snapshot.nodes.find((n) => n.id === "b")?.status;
        // the reservation's snapshot is slow to publish: whatever does not wait for it shows up first
        if (b === "reserved") await new Promise((r) => setTimeout(r, 200));
        const result = await inner(u, expected);
        if (b === "reserved") {
          const stored = await workflowJournal(db.pool, u.workflowId);
          log.push(
            `b reserved: journaled ${stored.nodes.b?.status}, model ${stored.nodeModels.b ?? "none"}, child ${stored.nodes.b?.childSessionId ?? "none"}`,
          );
        }
        return result;
      },
      workDirPolicy: async () => ({ kind: "scoped", project: { ref: "proj", root: project } }),
      // the node's placement is checked asynchronously, after its reservation is published
      admitNodeWorkDir: async () => {
        log.push("b placed");
      },
      wrap: (base): NodeDispatcher => ({
        ...base,
        createChild: (r) => {
          log.push(`${r.nodeId} child`);
          return base.createChild(r);
        },
        runNode: (r) => base.runNode(r),
        continueNode: (i, h) => base.continueNode(i, h),
      }),
    });
    all.push(engine);
    const def = parseWorkflowDefinition(`
name: reserve
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a], cwd: "." }
`);
    const started = await engine.start(
      w.ctx({
        access: { target: { kind: "host", ref: "proj" }, projectRef: "proj" },
        currentWorkDir: async () => project,
      }),
      { definition: def },
    );
    expect((await engine.finished(started.workflowId)).status).toBe("completed");
    expect(log.filter((l) => !l.startsWith("a "))).toEqual([
      "b reserved: journaled reserved, model none, child none",
      "b placed",
      "b child",
    ]);
  });
});
