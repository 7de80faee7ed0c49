import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { type NodeDispatcher, parseWorkflowDefinition } from "../src/index.js";
import {
  childMessages as childMessagesOf,
  closeEnginesAfterEach,
  storeWholeJournal,
  summaries,
  taskLine,
  until,
  untilAborted,
  workflowJournal,
  world,
} from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

const chain = parseWorkflowDefinition(`
name: chain
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);

const journal = (workflowId: string) => workflowJournal(db.pool, workflowId);

const childMessages = (childId: string) => childMessagesOf(db.pool, childId);

/** Only this test's workflows (one database serves the whole file). */
async function mine<T extends { resumed: string[]; invalid: string[]; refused: string[] }>(
  parent: string,
  r: T,
): Promise<T> {
  const { rows } = await db.pool.query("select id from workflows where parent_session_id = $1::uuid", [
    parent,
  ]);
  const ids = new Set(rows.map((x) => String(x.id)));
  return {
    ...r,
    resumed: r.resumed.filter((i) => ids.has(i)),
    invalid: r.invalid.filter((i) => ids.has(i)),
    refused: r.refused.filter((i) => ids.has(i)),
  };
}

async function childCount(parent: string): Promise<number> {
  const { rows } = await db.pool.query(
    "select count(*)::int n from sessions where parent_session_id = $1::uuid",
    [parent],
  );
  return rows[0].n;
}

describe("boot recovery", () => {
  // What a graceful close proves (the engine lets go without writing): the SIGKILL suite (crash.test.ts)
  // proves the same behaviours after a real process is killed.
  it("after a graceful close, the next boot continues the interrupted node in its own child: no second node, no budget charged", async () => {
    const w = await world(db.pool);
    const first = await w.engine(async ({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: chain });
    await until(
      async () =>
        (await journal(started.workflowId)).nodes.a?.status === "running" &&
        first.engine.run(started.workflowId)?.started.has("a") === true,
      "a running",
    );
    const before = await journal(started.workflowId);
    // The process dies: nothing more is written, and its owner lease goes with its connection.
    await first.engine.close();
    const answered: string[] = [];
    const second = await w.engine(({ task }) => {
      answered.push(task);
      return `recovered ${taskLine(task)}`;
    });
    all.push(second.engine);
    const recovered = await mine(w.parentSessionId, await second.engine.recoverInterrupted());
    expect(recovered.resumed).toEqual([started.workflowId]);
    // A second pass while it runs here starts nothing twice.
    expect((await mine(w.parentSessionId, await second.engine.recoverInterrupted())).resumed).toEqual([]);
    const outcome = await second.engine.finished(started.workflowId);
    expect(outcome.status).toBe("completed");
    expect(await childCount(w.parentSessionId)).toBe(2); // a's child once, then b's
    const a = before.nodes.a?.childSessionId as string;
    const messages = await childMessages(a);
    expect(messages.map((m) => m.role)).toEqual(["user", "custom", "assistant"]);
    expect(messages[1]?.customType).toBe("interrupted");
    const row = await second.engine.store.getWorkflow(started.workflowId);
    expect(row?.recovery).toEqual({ workflowGeneration: 1, recoveryAdmissionVersion: 1 });
    expect(await summaries(db.pool, w.parentSessionId)).toHaveLength(1);
    expect(outcome.summary).toContain("- a: succeeded");
    // a's reservation was charged once at start; the continuation charged nothing; b charged its own.
    expect(before.dispatches).toBe(1);
  });

  it("a child whose answer settled before the crash is reused, not run again (S004-329)", async () => {
    const w = await world(db.pool);
    const first = await w.engine(({ task }) => `first answer of ${taskLine(task)}`, {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        continueNode: (r, host) => base.continueNode(r, host),
        // The answer reaches the child's journal, then the process dies before the engine settles the node.
        runNode: async (r) => {
          await base.runNode(r);
          return untilAborted(r.signal);
        },
      }),
    });
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: chain });
    await until(async () => {
      const a = (await journal(started.workflowId)).nodes.a?.childSessionId;
      return a !== undefined && (await childMessages(a)).some((m) => m.role === "assistant");
    }, "a answered in its child");
    await first.engine.close();
    const ran: string[] = [];
    const second = await w.engine(({ task }) => {
      ran.push(taskLine(task));
      return `second answer of ${taskLine(task)}`;
    });
    all.push(second.engine);
    await second.engine.recoverInterrupted();
    const outcome = await second.engine.finished(started.workflowId);
    expect(ran).toEqual(["TASK b"]);
    expect(outcome.summary).toContain("first answer of TASK a");
  });

  it("a planned child with an empty transcript survives boot and runs the workflow's original task (S004-331 S004-422)", async () => {
    const w = await world(db.pool);
    const first = await w.engine(() => "unused", {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        continueNode: (r, host) => base.continueNode(r, host),
        runNode: (r) => untilAborted(r.signal), // dies after the child exists, before its task is journaled
      }),
    });
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: chain });
    await until(async () => (await journal(started.workflowId)).nodes.a?.status === "running", "a planned");
    const childA = (await journal(started.workflowId)).nodes.a?.childSessionId as string;
    expect(await childMessages(childA)).toEqual([]);
    await first.engine.close();
    const second = await w.engine(({ task }) => `did ${taskLine(task)}`);
    all.push(second.engine);
    await second.engine.recoverInterrupted();
    await second.engine.finished(started.workflowId);
    const messages = await childMessages(childA);
    expect(messages[0]).toEqual({ role: "user", content: "TASK a" });
    expect(await childCount(w.parentSessionId)).toBe(2);
  });

  it("an old-format journal terminalizes only its workflow, with a report; others recover (S004-303 S004-304 S004-302)", async () => {
    const w = await world(db.pool);
    const first = await w.engine(async ({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const good = await first.engine.start(w.ctx(), { definition: chain });
    await until(async () => (await journal(good.workflowId)).nodes.a?.status === "running", "a running");
    const old = randomUUID();
    await db.pool.query(
      `insert into workflows (id, parent_session_id, principal_account_id, tool_call_id, name, created_at)
       values ($1::uuid, $2::uuid, $3::uuid, 'old-call', 'legacy', now() - interval '1 hour')`,
      [old, w.parentSessionId, w.accountId],
    );
    await db.pool.query("insert into workflow_journals (workflow_id, body) values ($1::uuid, $2::jsonb)", [
      old,
      JSON.stringify({ version: 1, nodes: [{ id: "x", state: "running" }] }),
    ]);
    await first.engine.close();
    const second = await w.engine(({ task }) => `ok ${taskLine(task)}`);
    all.push(second.engine);
    const recovered = await mine(w.parentSessionId, await second.engine.recoverInterrupted());
    expect(recovered.invalid).toEqual([old]);
    expect(recovered.resumed).toEqual([good.workflowId]);
    await second.engine.finished(good.workflowId);
    const results = await summaries(db.pool, w.parentSessionId);
    expect(results).toHaveLength(2);
    const report = results.find((r) => r.body.includes("legacy"));
    expect(report?.outcome).toBe("error");
    expect(report?.body).toContain(
      "could not be resumed: orchestration journal has format 1; recovery requires format 2",
    );
    const { rows } = await db.pool.query("select status from workflows where id = $1::uuid", [old]);
    expect(rows[0].status).toBe("invalid");
    // A second boot reports nothing twice.
    const third = await w.engine(() => "x");
    all.push(third.engine);
    expect(await mine(w.parentSessionId, await third.engine.recoverInterrupted())).toEqual({
      resumed: [],
      invalid: [],
      refused: [],
    });
    expect(await summaries(db.pool, w.parentSessionId)).toHaveLength(2);
  });

  it("a live owner's workflows are not claimed; a dead owner's are claimed by exactly one of two booting daemons", async () => {
    const w = await world(db.pool);
    const live = await w.engine(async ({ signal }) => untilAborted(signal));
    all.push(live.engine);
    const kept = await live.engine.start(w.ctx(), { definition: chain });
    const dying = await w.engine(async ({ signal }) => untilAborted(signal));
    all.push(dying.engine);
    const orphans: string[] = [];
    for (let i = 0; i < 4; i++)
      orphans.push((await dying.engine.start(w.ctx(), { definition: chain })).workflowId);
    await until(async () => {
      for (const id of orphans) if ((await journal(id)).nodes.a?.status !== "running") return false;
      return true;
    }, "all running");
    await dying.engine.close();
    const b = await w.engine(async ({ signal }) => untilAborted(signal));
    const c = await w.engine(async ({ signal }) => untilAborted(signal));
    all.push(b.engine, c.engine);
    const [rb, rc] = await Promise.all([
      b.engine.recoverInterrupted().then((r) => mine(w.parentSessionId, r)),
      c.engine.recoverInterrupted().then((r) => mine(w.parentSessionId, r)),
    ]);
    const claimed = [...rb.resumed, ...rc.resumed].sort();
    expect(claimed).toEqual([...orphans].sort());
    expect(claimed).not.toContain(kept.workflowId);
  });

  it("a live takeover claims only a dead owner's workflows, shows them before they resume, and never drives one twice", async () => {
    const w = await world(db.pool);
    const live = await w.engine(async ({ signal }) => untilAborted(signal));
    all.push(live.engine);
    const kept = await live.engine.start(w.ctx(), { definition: chain });
    const taker = await w.engine(({ task }) => `taken ${taskLine(task)}`);
    all.push(taker.engine);
    const dying = await w.engine(async ({ signal }) => untilAborted(signal));
    all.push(dying.engine);
    const orphan = await dying.engine.start(w.ctx(), { definition: chain });
    await until(
      async () =>
        (await journal(orphan.workflowId)).nodes.a?.status === "running" &&
        (await journal(kept.workflowId)).nodes.a?.status === "running",
      "both running",
    );
    await dying.engine.close();
    const seen: string[] = [];
    const pass = () =>
      taker.engine.recoverInterrupted(1000, {
        deadOwnersOnly: true,
        claimed: async (rows) => {
          for (const r of rows) if (r.parentSessionId === w.parentSessionId) seen.push(r.id);
        },
      });
    expect((await mine(w.parentSessionId, await pass())).resumed).toEqual([orphan.workflowId]);
    expect(seen).toEqual([orphan.workflowId]);
    expect((await mine(w.parentSessionId, await pass())).resumed).toEqual([]);
    expect((await taker.engine.finished(orphan.workflowId)).status).toBe("completed");
    const row = await live.engine.store.getWorkflow(kept.workflowId);
    expect(row?.status).toBe("running");
    expect(live.engine.runIds()).toContain(kept.workflowId);
    expect(taker.engine.runIds()).not.toContain(kept.workflowId);
  });

  it("boot checks each node's journaled scope, not only the workflow's: a node scope beyond current access refuses the resume (S004-389)", async () => {
    const w = await world(db.pool);
    const first = await w.engine(async ({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const started = await first.engine.start(w.ctx({ access: { tools: { allow: ["Read"] } } }), {
      definition: chain,
    });
    await until(async () => (await journal(started.workflowId)).nodes.a?.status === "running", "a running");
    await first.engine.close();
    // The workflow's own access (Read) still fits the account; node a's journaled scope claims Bash.
    const j = await journal(started.workflowId);
    const scope = JSON.parse(j.nodeAccess.a as string);
    j.nodeAccess.a = JSON.stringify({ ...scope, tools: { ...scope.tools, allow: ["Bash"] } });
    await storeWholeJournal(db.pool, started.workflowId, j);
    await db.pool.query("update accounts set tool_allow = array['Bash(git *)', 'Read'] where id = $1::uuid", [
      w.accountId,
    ]);
    // Turns of every workflow this boot claims are seen; only this workflow's children count here.
    const ran: string[] = [];
    const second = await w.engine(({ sessionId }) => {
      ran.push(sessionId);
      return "x";
    });
    all.push(second.engine);
    const recovered = await mine(w.parentSessionId, await second.engine.recoverInterrupted());
    expect(recovered.refused).toEqual([started.workflowId]);
    const outcome = await second.engine.finished(started.workflowId);
    expect(outcome.summary).toContain("journaled access exceeds current access (node a: tools");
    const { rows } = await db.pool.query("select id::text from sessions where parent_session_id = $1::uuid", [
      w.parentSessionId,
    ]);
    expect(ran.filter((id) => rows.some((r) => r.id === id))).toEqual([]);
  });

  it("boot checks every journaled scope against current access and starts nothing when the workflow's own scope exceeds it (S004-389)", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: narrowed
nodes:
  - { id: a, task: "TASK a", tools: { allow: ["Bash"] } }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);
    const first = await w.engine(async ({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: def });
    await until(async () => (await journal(started.workflowId)).nodes.a?.status === "running", "a running");
    await first.engine.close();
    // The account's grant narrowed meanwhile: Bash(git *) only overlaps the journaled Bash.
    await db.pool.query("update accounts set tool_allow = array['Bash(git *)', 'Read'] where id = $1::uuid", [
      w.accountId,
    ]);
    const ran: string[] = [];
    const second = await w.engine(({ sessionId }) => {
      ran.push(sessionId);
      return "x";
    });
    all.push(second.engine);
    const recovered = await mine(w.parentSessionId, await second.engine.recoverInterrupted());
    expect(recovered.refused).toEqual([started.workflowId]);
    await until(async () => (await summaries(db.pool, w.parentSessionId)).length === 1, "report");
    const [report] = await summaries(db.pool, w.parentSessionId);
    expect(report?.body).toContain("could not be resumed: journaled access exceeds current access");
    const { rows } = await db.pool.query("select id from sessions where parent_session_id = $1::uuid", [
      w.parentSessionId,
    ]);
    expect(ran.filter((id) => rows.some((r) => r.id === id))).toEqual([]);
  });
});
