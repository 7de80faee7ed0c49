import { randomUUID } from "node:crypto";
import type { JournalEntry } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { extendedJournal } from "../src/engine/journalDispatcher.js";
import { parseWorkflowDefinition, SnapshotPublisher, type WorkflowUpdate } from "../src/index.js";
import { TickBatchedReader } from "../src/store/batch.js";
import {
  closeEnginesAfterEach,
  deferred,
  taskLine,
  until,
  untilAborted,
  workflowJournal,
  world,
} from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

function update(
  workflowId: string,
  label: string,
  status: WorkflowUpdate["status"] = "running",
): WorkflowUpdate {
  return {
    workflowId,
    status,
    owner: "me",
    snapshot: { workflowId, name: label, status, run: 1, nodes: [] },
  };
}

function entry(seq: number, settled = true): JournalEntry {
  return {
    sessionId: "s",
    seq,
    settled,
    createdAt: new Date(0),
    body: { type: "message", message: { role: "user", content: `row ${seq}` } },
  };
}

describe("group commit of a workflow's writes", () => {
  it("running snapshots queued behind a write in flight share the next write, which carries the newest", async () => {
    const gate = deferred();
    const inFlight = deferred();
    const emitted: string[] = [];
    const publisher = new SnapshotPublisher(async (u) => {
      if (emitted.length === 0) {
        inFlight.resolve();
        await gate.promise;
      }
      emitted.push(u.snapshot.name);
      return { status: "updated" };
    });
    const id = randomUUID();
    const first = publisher.queue(update(id, "first"), 1);
    await inFlight.promise;
    const joined = [publisher.queue(update(id, "second"), 1), publisher.queue(update(id, "third"), 1)];
    // Another fence (generation) or a terminal snapshot is never folded into a running one.
    const otherGeneration = publisher.queue(update(id, "fourth"), 2);
    const terminal = publisher.queue(update(id, "done", "completed"), 2);
    gate.resolve();
    const results = await Promise.all([first, ...joined, otherGeneration, terminal]);
    expect(results.every((r) => r.status === "updated")).toBe(true);
    expect(emitted).toEqual(["first", "third", "fourth", "done"]);
  });

  it("a workflow's parallel nodes share journal writes, and the stored journal is the run's", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(
      JSON.stringify({
        name: "wide",
        nodes: Array.from({ length: 10 }, (_, i) => ({ id: `n${i}`, task: `TASK n${i}` })),
      }),
      "json",
    );
    const { engine } = await w.engine(({ signal }) => untilAborted(signal));
    all.push(engine);
    let writes = 0;
    const write = engine.store.writeJournalText.bind(engine.store);
    engine.store.writeJournalText = (...args) => {
      writes++;
      return write(...args);
    };
    const started = await engine.start(w.ctx(), { definition: def });
    const run = engine.run(started.workflowId);
    await until(() => run?.started.size === 10, "every node running");
    // Unshared, the start and every node's reservation and child would be 21 writes.
    expect(writes).toBeLessThan(21);
    const stored = await workflowJournal(db.pool, started.workflowId);
    expect(stored).toEqual(JSON.parse(JSON.stringify(run?.journal)));
    expect(Object.values(stored.nodes).map((n) => n.status)).toEqual(Array(10).fill("running"));
  });
});

describe("reads batched per tick", () => {
  it("reads asked in one tick share one load; a later read gets its own; a failure reaches its batch only", async () => {
    const loads: string[][] = [];
    let fail = false;
    const reader = new TickBatchedReader<string, number>(async (keys) => {
      loads.push(keys);
      if (fail) throw new Error("down");
      return new Map(keys.filter((k) => k !== "missing").map((k) => [k, k.length]));
    });
    const same = await Promise.all([
      reader.read("a"),
      reader.read("bb"),
      reader.read("a"),
      reader.read("missing"),
    ]);
    expect(same).toEqual([1, 2, 1, undefined]);
    expect(await reader.read("ccc")).toBe(3);
    expect(loads).toEqual([["a", "bb", "missing"], ["ccc"]]);
    fail = true;
    await expect(Promise.all([reader.read("a"), reader.read("b")])).rejects.toThrow("down");
    fail = false;
    expect(await reader.read("dd")).toBe(2);
  });
});

describe("a child's journal known without reading it again", () => {
  it("only rows that took the very next sequence numbers, settled, extend what was read", () => {
    expect(extendedJournal([], [entry(1)])?.map((e) => e.seq)).toEqual([1]);
    expect(extendedJournal([entry(1), entry(2)], [entry(3), entry(4)])?.map((e) => e.seq)).toEqual([
      1, 2, 3, 4,
    ]);
    // Another writer's row (any, provisional or not) took a number in between: read the journal instead.
    expect(extendedJournal([entry(1)], [entry(3)])).toBeUndefined();
    expect(extendedJournal([], [entry(2)])).toBeUndefined();
    expect(extendedJournal([entry(1)], [entry(2, false)])).toBeUndefined();
  });
});

describe("a boot continuation of a node journaled running", () => {
  it("a Stop recorded after the claim cancels it before its turn, though no journal write fences it first", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: stopped
nodes:
  - { id: a, task: "TASK a" }
`);
    const first = await w.engine(({ signal }) => untilAborted(signal));
    const started = await first.engine.start(w.ctx(), { definition: def });
    await until(() => first.engine.run(started.workflowId)?.started.has("a") === true, "a running");
    await first.engine.close();
    let turns = 0;
    // Other tests' orphaned workflows are claimed by the same pass: only this node's turns count.
    const second = await w.engine(({ task }) => {
      if (taskLine(task) === "TASK a") turns++;
      return "continued";
    });
    all.push(second.engine);
    const recovered = await second.engine.recoverInterrupted(1000, {
      // Another process records a Stop once this one holds the lease, before anything resumes.
      claimed: async () => {
        await db.pool.query("update workflows set cancel_requested_at = now() where id = $1::uuid", [
          started.workflowId,
        ]);
      },
    });
    expect(recovered.resumed).toContain(started.workflowId);
    const outcome = await second.engine.finished(started.workflowId);
    expect(outcome.status).toBe("cancelled");
    expect(turns).toBe(0);
  });
});
