import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { createPool, migrate, migrationsDir, migrationsTable } from "@crw/db";
import { emptyDatabase, useTestDatabase } from "@crw/tools/pg";
import type pg from "pg";
import { describe, expect, it } from "vitest";
import {
  type OrchestrationJournal,
  PgWorkflowStore,
  parseWorkflowDefinition,
  type WorkflowEngine,
} from "../src/index.js";
import { type JournalWrite, wholeJournalWrite } from "../src/store/journalLayout.js";
import { closeEnginesAfterEach, taskLine, until, untilAborted, workflowJournal, world } from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

const MIGRATION = "0033_workflow_journal_nodes";

const three = parseWorkflowDefinition(`
name: three
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
  - { id: c, task: "TASK c" }
`);

/** Everything stored of a workflow's journal, raw: its header row and its node rows. */
async function storedRows(pool: pg.Pool, workflowId: string) {
  const head = await pool.query(
    "select body, revision::int, node_rows from workflow_journals where workflow_id = $1::uuid",
    [workflowId],
  );
  const nodes = await pool.query(
    "select node_id, position, body from workflow_journal_nodes where workflow_id = $1::uuid order by node_id",
    [workflowId],
  );
  return { head: head.rows[0], nodes: nodes.rows };
}

/** A workflow left by a closed engine: `a` answered, `b` and `c` mid-turn (their rows are leased to it). */
async function leftRunning(pool: pg.Pool) {
  const w = await world(pool);
  const { engine } = await w.engine(({ task, signal }) =>
    taskLine(task) === "TASK a" ? "done a" : untilAborted(signal),
  );
  const started = await engine.start(w.ctx(), { definition: three });
  const run = engine.run(started.workflowId);
  await until(() => run?.started.has("b") === true && run.started.has("c"), "b and c running");
  await engine.close();
  const row = await new PgWorkflowStore(pool).getWorkflow(started.workflowId);
  if (!row?.lockedBy) throw new Error("no lease");
  return { w, workflowId: started.workflowId, owner: row.lockedBy };
}

/** A write that names `a` (changed) and then a row the table refuses. */
function halfBadWrite(journal: OrchestrationJournal): JournalWrite {
  const whole = wholeJournalWrite({ ...journal, dispatches: journal.dispatches + 7 });
  const a = whole.nodes.find((n) => n.id === "a");
  if (!a) throw new Error("no row of a");
  const changed = { ...a, body: a.body.replace('"succeeded"', '"failed"') };
  return { header: whole.header, nodes: [changed, { id: "b", position: -1, body: "{}" }] };
}

describe("the orchestration journal stored as a header and one row per node", () => {
  it("a write naming several nodes is all or nothing: when one row is refused, the header and the other rows stay as they were", async () => {
    const left = await leftRunning(db.pool);
    const store = new PgWorkflowStore(db.pool);
    const before = await storedRows(db.pool, left.workflowId);
    const journal = await workflowJournal(db.pool, left.workflowId);
    await expect(
      store.writeJournalText(left.workflowId, halfBadWrite(journal), 1, left.owner),
    ).rejects.toThrow(/check constraint/);
    expect(await storedRows(db.pool, left.workflowId)).toEqual(before);
    // The same write without the refused row is accepted whole (the fence passes: the refusal was the row).
    const good = halfBadWrite(journal);
    expect(
      (
        await store.writeJournalText(
          left.workflowId,
          { ...good, nodes: [good.nodes[0]] } as JournalWrite,
          1,
          left.owner,
        )
      ).written,
    ).toBe(true);
    const after = await workflowJournal(db.pool, left.workflowId);
    expect(after.nodes.a?.status).toBe("failed");
    expect(after.dispatches).toBe(journal.dispatches + 7);
  });

  it("a write under a superseded generation or another owner's lease changes no row", async () => {
    const left = await leftRunning(db.pool);
    const store = new PgWorkflowStore(db.pool);
    const before = await storedRows(db.pool, left.workflowId);
    const journal = await workflowJournal(db.pool, left.workflowId);
    const changed = wholeJournalWrite({ ...journal, dispatches: 99 });
    expect((await store.writeJournalText(left.workflowId, changed, 2, left.owner)).written).toBe(false);
    expect((await store.writeJournalText(left.workflowId, changed, 1, "another-daemon")).written).toBe(false);
    expect(await storedRows(db.pool, left.workflowId)).toEqual(before);
    // The current lease and generation write it.
    expect((await store.writeJournalText(left.workflowId, changed, 1, left.owner)).written).toBe(true);
    expect((await workflowJournal(db.pool, left.workflowId)).dispatches).toBe(99);
  });

  it("the journal read back is the one written: order, node states and per-node maps, entries naming no node included", async () => {
    const left = await leftRunning(db.pool);
    const store = new PgWorkflowStore(db.pool);
    const journal = await workflowJournal(db.pool, left.workflowId);
    const written: OrchestrationJournal = {
      ...journal,
      order: ["c", "a", "b"],
      nodeModels: { ...journal.nodeModels, "not-a-node": "kept" },
      nodeWorktrees: {
        b: { repoRoot: "/r", path: "/w/b", branch: "crw/b", baseCommit: "abc", startedFromBranch: null },
      },
    };
    expect(await store.writeJournal(left.workflowId, written, 1, left.owner)).toBe(true);
    expect(await store.readJournal(left.workflowId)).toEqual(written);
    const raw = await storedRows(db.pool, left.workflowId);
    expect(raw.head.node_rows).toBe(true);
    expect(raw.head.body.nodes).toBeUndefined();
    expect(raw.head.body.nodeModels).toEqual({ "not-a-node": "kept" });
    expect(raw.nodes.map((n: { node_id: string; position: number }) => [n.node_id, n.position])).toEqual([
      ["a", 1],
      ["b", 2],
      ["c", 0],
    ]);
  });

  it("the stored journal equals the run's own through reservations, added nodes, a failure and the nodes it blocks", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: mixed
nodes:
  - { id: grow, task: "TASK grow" }
  - { id: bad, task: "TASK bad" }
  - { id: after-bad, task: "TASK after-bad", dependsOn: [bad] }
  - { id: after-after, task: "TASK after-after", dependsOn: [after-bad] }
`);
    let engine!: WorkflowEngine;
    let workflowId = "";
    const opened = await w.engine(async ({ task, sessionId }) => {
      const line = taskLine(task);
      if (line === "TASK bad") throw new Error("no");
      if (line === "TASK grow") {
        await engine.addNodes({
          workflowId,
          principalAccountId: w.accountId,
          fromNodeId: "grow",
          callerSessionId: sessionId,
          nodes: [{ id: "added", task: "TASK added", dependsOn: ["grow"] }],
        });
      }
      return `ok ${line}`;
    });
    engine = opened.engine;
    all.push(engine);
    const p = engine.start(w.ctx(), { definition: def });
    workflowId = (await p).workflowId;
    const run = engine.run(workflowId);
    const outcome = await engine.finished(workflowId);
    expect(outcome.status).toBe("failed");
    const stored = await workflowJournal(db.pool, workflowId);
    expect(stored).toEqual(JSON.parse(JSON.stringify(run?.journal)));
    expect(stored.order).toEqual(["grow", "bad", "after-bad", "after-after", "added"]);
    expect(Object.fromEntries(stored.order.map((id) => [id, stored.nodes[id]?.status]))).toEqual({
      grow: "succeeded",
      bad: "failed",
      "after-bad": "blocked",
      "after-after": "blocked",
      added: "succeeded",
    });
  });

  it("the bytes a workflow's journal writes send per node stay the same from 10 to 60 nodes", async () => {
    const perNode: number[] = [];
    for (const n of [10, 60]) {
      const w = await world(db.pool);
      const nodes = Array.from({ length: n }, (_, i) => ({
        id: `n${String(i).padStart(3, "0")}`,
        task: `TASK ${i}`,
        ...(i > 0 ? { dependsOn: [`n${String(i - 1).padStart(3, "0")}`] } : {}),
      }));
      const def = parseWorkflowDefinition(JSON.stringify({ name: `chain-${n}`, nodes }), "json");
      const { engine } = await w.engine(({ task }) => `ok ${taskLine(task)}`);
      all.push(engine);
      let bytes = 0;
      const write = engine.store.writeJournalText.bind(engine.store);
      engine.store.writeJournalText = (id, change, ...rest) => {
        bytes += change.header.length + change.nodes.reduce((s, r) => s + r.id.length + r.body.length, 0);
        return write(id, change, ...rest);
      };
      const started = await engine.start(w.ctx(), { definition: def });
      expect((await engine.finished(started.workflowId)).status).toBe("completed");
      perNode.push(bytes / n);
    }
    const [small, large] = perNode as [number, number];
    // A whole-document write per node event would send about six times as much per node at 60 nodes.
    expect(large).toBeLessThan(small * 1.2);
  });
});

describe(`migration ${MIGRATION}`, () => {
  it("carries a journal stored whole over to header and node rows, and the engine resumes the workflow from it", async () => {
    const empty = await emptyDatabase();
    const pool = createPool({ connectionString: empty.url, max: 8 });
    try {
      await migrate(empty.url);
      const left = await leftRunning(pool);
      const journal = await workflowJournal(pool, left.workflowId);
      // Back to the layout before the migration: the journal as one document, no node rows (the migrations
      // after it undone first, newest first).
      const since = (await readdir(migrationsDir))
        .filter((f) => f.endsWith(".sql"))
        .map((f) => f.slice(0, -".sql".length))
        .filter((name) => name >= MIGRATION)
        .sort();
      for (const name of [...since].reverse()) {
        const sql = await readFile(join(migrationsDir, `${name}.sql`), "utf8");
        await pool.query(sql.slice(sql.indexOf("-- Down Migration")));
        await pool.query(`delete from ${migrationsTable} where name = $1`, [name]);
      }
      const { rows } = await pool.query("select body from workflow_journals where workflow_id = $1::uuid", [
        left.workflowId,
      ]);
      expect(rows[0].body).toEqual(journal);

      expect(await migrate(empty.url)).toEqual(since);
      const raw = await storedRows(pool, left.workflowId);
      expect(raw.head.node_rows).toBe(true);
      expect(raw.head.body.order).toBeUndefined();
      expect(raw.nodes.map((n: { node_id: string }) => n.node_id)).toEqual(["a", "b", "c"]);
      expect(await workflowJournal(pool, left.workflowId)).toEqual(journal);

      const turns: string[] = [];
      const second = await left.w.engine(({ task }) => {
        turns.push(taskLine(task));
        return `resumed ${taskLine(task)}`;
      });
      all.push(second.engine);
      const recovered = await second.engine.recoverInterrupted();
      expect(recovered.resumed).toEqual([left.workflowId]);
      expect((await second.engine.finished(left.workflowId)).status).toBe("completed");
      // b and c continued in the children the journal names; a (answered before) ran nothing again.
      expect(turns.sort()).toEqual(["TASK b", "TASK c"]);
      const children = await pool.query(
        "select count(*)::int n from sessions where kind = 'delegated' and parent_session_id = $1::uuid",
        [left.w.parentSessionId],
      );
      expect(children.rows[0].n).toBe(3);
    } finally {
      for (const e of all.splice(0)) await e.close();
      await pool.end();
      await empty.drop();
    }
  });
});
