import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { type NodeDispatcher, parseWorkflowDefinition, uuidFrom } from "../src/index.js";
import {
  closeEnginesAfterEach,
  deferred,
  summaries,
  taskLine,
  until,
  untilAborted,
  workflowJournal,
  world,
} from "./helpers.js";

/**
 * Boot recovery's claim pass and one workflow's resume, on a real database: what a pass claims, hands back
 * and reports, and what a claimed workflow's journal decides (deliver only, refuse, continue, prepare).
 */
const db = useTestDatabase();
const all = closeEnginesAfterEach();

const journal = (workflowId: string) => workflowJournal(db.pool, workflowId);

const chain = parseWorkflowDefinition(`
name: chain
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);

type World = Awaited<ReturnType<typeof world>>;

async function lockOf(workflowId: string): Promise<string | null> {
  const { rows } = await db.pool.query("select locked_by from workflows where id = $1::uuid", [workflowId]);
  return rows[0]?.locked_by ?? null;
}

async function childCount(w: World): Promise<number> {
  const { rows } = await db.pool.query(
    "select count(*)::int n from sessions where parent_session_id = $1::uuid",
    [w.parentSessionId],
  );
  return rows[0].n;
}

/** Starts `chain` in a first engine, waits until a's turn runs, and lets that engine die. */
async function interrupted(w: World) {
  const first = await w.engine(({ signal }) => untilAborted(signal));
  all.push(first.engine);
  const started = await first.engine.start(w.ctx(), { definition: chain });
  await until(() => first.engine.run(started.workflowId)?.started.has("a") === true, "a running");
  await first.engine.close();
  return started;
}

/** A workflow row whose journal no reader accepts (as a corrupted or foreign write would leave it). */
async function garbled(w: World, status = "running"): Promise<string> {
  const id = randomUUID();
  await db.pool.query(
    `insert into workflows (id, parent_session_id, principal_account_id, tool_call_id, name, status)
     values ($1::uuid, $2::uuid, $3::uuid, 'bad-call', 'garbled', $4)`,
    [id, w.parentSessionId, w.accountId, status],
  );
  await db.pool.query("insert into workflow_journals (workflow_id, body) values ($1::uuid, $2::jsonb)", [
    id,
    JSON.stringify({ version: 2, nodes: "not a map" }),
  ]);
  return id;
}

/** This world's ids only (one database serves the whole file). */
async function mine(w: World, r: { resumed: string[]; invalid: string[]; refused: string[] }) {
  const { rows } = await db.pool.query("select id from workflows where parent_session_id = $1::uuid", [
    w.parentSessionId,
  ]);
  const ids = new Set(rows.map((x) => String(x.id)));
  return {
    resumed: r.resumed.filter((i) => ids.has(i)),
    invalid: r.invalid.filter((i) => ids.has(i)),
    refused: r.refused.filter((i) => ids.has(i)),
  };
}

describe("a recovery pass's claims", () => {
  it("a claimed hook that throws hands every claimed workflow back, resumes none, and the next pass takes them", async () => {
    const w = await world(db.pool);
    const one = await interrupted(w);
    const two = await interrupted(w);
    const owner = `taker-${randomUUID()}`;
    const taker = await w.engine(({ task }) => `done ${taskLine(task)}`, { owner });
    all.push(taker.engine);
    const boom = new Error("the host cannot take them now");
    await expect(
      taker.engine.recoverInterrupted(1000, {
        claimed: async () => {
          throw boom;
        },
      }),
    ).rejects.toBe(boom);
    expect(taker.engine.runIds()).not.toContain(one.workflowId);
    expect(taker.engine.runIds()).not.toContain(two.workflowId);
    expect(await lockOf(one.workflowId)).toBe(`${owner}:handed-back`);
    expect(await lockOf(two.workflowId)).toBe(`${owner}:handed-back`);
    // Nothing ran meanwhile: a is still the running node of each journal.
    expect((await journal(one.workflowId)).nodes.a?.status).toBe("running");
    const seen: string[] = [];
    const again = await mine(
      w,
      await taker.engine.recoverInterrupted(1000, {
        claimed: async (rows) => {
          for (const r of rows) seen.push(r.id);
        },
      }),
    );
    expect(again.resumed.sort()).toEqual([one.workflowId, two.workflowId].sort());
    expect(seen).toEqual(expect.arrayContaining([one.workflowId, two.workflowId]));
    expect((await taker.engine.finished(one.workflowId)).status).toBe("completed");
    expect((await taker.engine.finished(two.workflowId)).status).toBe("completed");
  });

  it("a pass that claims nothing never calls the claimed hook", async () => {
    const w = await world(db.pool);
    const started = await interrupted(w);
    const taker = await w.engine(({ task }) => `done ${taskLine(task)}`);
    all.push(taker.engine);
    await taker.engine.recoverInterrupted();
    expect((await taker.engine.finished(started.workflowId)).status).toBe("completed");
    let calls = 0;
    // Every workflow is either finished or driven by a live owner now: a takeover finds nothing.
    const r = await taker.engine.recoverInterrupted(1000, {
      deadOwnersOnly: true,
      claimed: async () => {
        calls++;
      },
    });
    expect(await mine(w, r)).toEqual({ resumed: [], invalid: [], refused: [] });
    expect(calls).toBe(0);
  });

  it("a workflow whose resume throws is reported refused and handed back; the others still resume, and a later pass takes it", async () => {
    const w = await world(db.pool);
    const broken = await interrupted(w);
    const fine = await interrupted(w);
    const owner = `taker-${randomUUID()}`;
    const taker = await w.engine(({ task }) => `done ${taskLine(task)}`, { owner });
    all.push(taker.engine);
    // The row store fails for one workflow only while it resumes (its boot publication).
    const publish = taker.engine.store.publishSnapshot.bind(taker.engine.store);
    taker.engine.store.publishSnapshot = async (workflowId, ...rest) => {
      if (workflowId === broken.workflowId) throw new Error("the database refused the snapshot");
      return publish(workflowId, ...rest);
    };
    const r = await mine(w, await taker.engine.recoverInterrupted());
    expect(r.refused).toEqual([broken.workflowId]);
    expect(r.resumed).toEqual([fine.workflowId]);
    expect(taker.events).toContainEqual({
      type: "invalid_journal",
      workflowId: broken.workflowId,
      reason: "the database refused the snapshot",
    });
    expect((await taker.engine.finished(fine.workflowId)).status).toBe("completed");
    // Not driven here and not held by this live owner: the next pass (once the fault is gone) takes it.
    expect(taker.engine.runIds()).not.toContain(broken.workflowId);
    expect(await lockOf(broken.workflowId)).toBe(`${owner}:handed-back`);
    taker.engine.store.publishSnapshot = publish;
    expect((await mine(w, await taker.engine.recoverInterrupted())).resumed).toEqual([broken.workflowId]);
    expect((await taker.engine.finished(broken.workflowId)).status).toBe("completed");
  });

  it("a workflow that fails before any run of it is registered (its invalid-journal report cannot be handed over) is reported refused and handed back; the pass completes, the others resume, and a later pass takes it (S004-304)", async () => {
    const w = await world(db.pool);
    const bad = await garbled(w);
    const fine = await interrupted(w);
    const owner = `taker-${randomUUID()}`;
    const taker = await w.engine(({ task }) => `done ${taskLine(task)}`, { owner });
    all.push(taker.engine);
    // The store fails once, for that workflow only, while its report is handed over: nothing of it runs here.
    const deliver = taker.engine.store.deliverSummary.bind(taker.engine.store);
    let refusals = 0;
    taker.engine.store.deliverSummary = async (input) => {
      if (input.workflowId === bad && refusals++ === 0) throw new Error("the database refused the report");
      return deliver(input);
    };
    const pass = taker.engine.recoverInterrupted();
    await expect(pass).resolves.toBeDefined();
    expect(await mine(w, await pass)).toEqual({ resumed: [fine.workflowId], invalid: [], refused: [bad] });
    expect(refusals).toBe(1);
    expect(taker.events).toContainEqual({
      type: "invalid_journal",
      workflowId: bad,
      reason: "the database refused the report",
    });
    expect((await taker.engine.finished(fine.workflowId)).status).toBe("completed");
    expect(taker.engine.runIds()).not.toContain(bad);
    expect(await lockOf(bad)).toBe(`${owner}:handed-back`);
    expect((await summaries(db.pool, w.parentSessionId)).map((s) => s.id)).not.toContain(
      uuidFrom(`${bad}:invalid`),
    );
    // The next pass takes it again and hands its report over.
    expect(await mine(w, await taker.engine.recoverInterrupted())).toEqual({
      resumed: [],
      invalid: [bad],
      refused: [],
    });
    expect((await summaries(db.pool, w.parentSessionId)).map((s) => s.id)).toContain(
      uuidFrom(`${bad}:invalid`),
    );
    expect(await lockOf(bad)).toBeNull();
  });
});

describe("passes that overlap", () => {
  it("two passes at once in one engine drive a workflow once; a pass while it runs here shows the hook nothing", async () => {
    const w = await world(db.pool);
    const started = await interrupted(w);
    const gate = deferred();
    const ran: string[] = [];
    const taker = await w.engine(async ({ task }) => {
      ran.push(taskLine(task));
      await gate.promise;
      return `done ${taskLine(task)}`;
    });
    all.push(taker.engine);
    const [one, two] = await Promise.all([
      taker.engine.recoverInterrupted(),
      taker.engine.recoverInterrupted(),
    ]);
    const resumed = [...(await mine(w, one)).resumed, ...(await mine(w, two)).resumed];
    expect(resumed).toEqual([started.workflowId]);
    const seen: string[] = [];
    // Its row is leased by this owner: the pass claims it again, and leaves it out as driven here.
    const again = await taker.engine.recoverInterrupted(1000, {
      claimed: async (rows) => {
        for (const r of rows) if (r.parentSessionId === w.parentSessionId) seen.push(r.id);
      },
    });
    expect(await mine(w, again)).toEqual({ resumed: [], invalid: [], refused: [] });
    expect(seen).toEqual([]);
    gate.resolve();
    expect((await taker.engine.finished(started.workflowId)).status).toBe("completed");
    expect(ran).toEqual(["TASK a", "TASK b"]);
  });

  it("a live takeover leaves an unleased workflow alone; a boot pass takes it", async () => {
    const w = await world(db.pool);
    const started = await interrupted(w);
    await db.pool.query("update workflows set locked_by = null where id = $1::uuid", [started.workflowId]);
    const taker = await w.engine(({ task }) => `done ${taskLine(task)}`);
    all.push(taker.engine);
    const takeover = await taker.engine.recoverInterrupted(1000, { deadOwnersOnly: true });
    expect((await mine(w, takeover)).resumed).toEqual([]);
    expect(await lockOf(started.workflowId)).toBeNull();
    expect((await mine(w, await taker.engine.recoverInterrupted())).resumed).toEqual([started.workflowId]);
    expect((await taker.engine.finished(started.workflowId)).status).toBe("completed");
  });
});

describe("an engine with no event sink", () => {
  it("still reports an invalid journal as invalid and a resume that throws as refused", async () => {
    const w = await world(db.pool);
    const id = await garbled(w);
    const broken = await interrupted(w);
    const taker = await w.engine(() => "never", { onEvent: undefined });
    all.push(taker.engine);
    taker.engine.store.publishSnapshot = async () => {
      throw new Error("the database refused the snapshot");
    };
    const r = await mine(w, await taker.engine.recoverInterrupted());
    expect(r).toEqual({ resumed: [], invalid: [id], refused: [broken.workflowId] });
  });
});

describe("an invalid journal at boot", () => {
  it("terminalizes the workflow once, keeps its journal, lets go of its lease and reports it with a stable id", async () => {
    const w = await world(db.pool);
    const id = await garbled(w);
    const taker = await w.engine(() => "never");
    all.push(taker.engine);
    const r = await mine(w, await taker.engine.recoverInterrupted());
    expect(r).toEqual({ resumed: [], invalid: [id], refused: [] });
    const event = taker.events.find((e) => e.type === "invalid_journal");
    expect(event).toMatchObject({ type: "invalid_journal", workflowId: id });
    expect(event?.type === "invalid_journal" && event.reason.length).toBeGreaterThan(0);
    const [report] = await summaries(db.pool, w.parentSessionId);
    expect(report?.id).toBe(uuidFrom(`${id}:invalid`));
    expect(report?.outcome).toBe("error");
    expect(report?.body).toMatch(new RegExp(`^Workflow "garbled" \\(${id}\\) could not be resumed: .+\\.$`));
    expect(await lockOf(id)).toBeNull();
    const { rows } = await db.pool.query(
      "select w.status, w.generation, (select count(*)::int from workflow_journals j where j.workflow_id = w.id) journals from workflows w where w.id = $1::uuid",
      [id],
    );
    expect(rows[0]).toMatchObject({ status: "invalid", journals: 1 });
  });
});

describe("an invalid workflow whose report never reached the inbox", () => {
  it("gets its report at the next boot, under the generation its row holds", async () => {
    const w = await world(db.pool);
    const id = await garbled(w, "invalid");
    await db.pool.query("update workflows set generation = 3 where id = $1::uuid", [id]);
    const taker = await w.engine(() => "never");
    all.push(taker.engine);
    expect((await mine(w, await taker.engine.recoverInterrupted())).invalid).toEqual([id]);
    const [report] = await summaries(db.pool, w.parentSessionId);
    expect(report?.id).toBe(uuidFrom(`${id}:invalid`));
    expect(await lockOf(id)).toBeNull();
  });
});

describe("what a claimed workflow's row and journal decide", () => {
  for (const [status, words, outcome] of [
    ["completed", "completed", "ok"],
    ["failed", "failed", "error"],
    ["cancelled", "was cancelled", "error"],
  ] as const) {
    it(`a ${status} workflow whose summary never reached the inbox gets it at boot, once, and runs nothing`, async () => {
      const w = await world(db.pool);
      const first = await w.engine(async ({ task, signal }) => {
        if (status === "failed") throw new Error("provider down");
        if (status === "cancelled") return untilAborted(signal);
        return `done ${taskLine(task)}`;
      });
      all.push(first.engine);
      // The terminal snapshot is published, then the process dies before the summary is handed over.
      first.engine.store.deliverSummary = () => new Promise(() => undefined);
      const started = await first.engine.start(w.ctx(), { definition: chain });
      const id = started.workflowId;
      if (status === "cancelled") {
        await until(() => first.engine.run(id)?.started.has("a") === true, "a running");
        void first.engine.cancel(id, w.accountId);
      }
      await until(async () => (await first.engine.store.getWorkflow(id))?.status === status, "terminal row");
      await first.engine.close();
      expect(await summaries(db.pool, w.parentSessionId)).toEqual([]);
      const children = await childCount(w);
      const second = await w.engine(() => "never");
      all.push(second.engine);
      expect((await mine(w, await second.engine.recoverInterrupted())).resumed).toEqual([id]);
      expect((await second.engine.finished(id)).status).toBe(status);
      const delivered = await summaries(db.pool, w.parentSessionId);
      expect(delivered).toHaveLength(1);
      expect(delivered[0]?.body.split("\n")[0]).toBe(`Workflow "chain" (${id}) ${words}, run 1.`);
      expect(delivered[0]?.outcome).toBe(outcome);
      // No node ran again: no new child of the parent.
      expect(await childCount(w)).toBe(children);
      expect(await lockOf(id)).toBeNull();
      const third = await w.engine(() => "never");
      all.push(third.engine);
      expect(await mine(w, await third.engine.recoverInterrupted())).toEqual({
        resumed: [],
        invalid: [],
        refused: [],
      });
    });
  }

  it("a Stop that arrives while boot hands over a failed workflow's summary answers with that outcome and changes nothing", async () => {
    const w = await world(db.pool);
    const first = await w.engine(async () => {
      throw new Error("provider down");
    });
    all.push(first.engine);
    first.engine.store.deliverSummary = () => new Promise(() => undefined);
    const id = (await first.engine.start(w.ctx(), { definition: chain })).workflowId;
    await until(async () => (await first.engine.store.getWorkflow(id))?.status === "failed", "terminal row");
    await first.engine.close();

    const second = await w.engine(() => "never");
    all.push(second.engine);
    // Boot's handover is held at the summary's write, so the Stop lands while it is under way.
    const store = second.engine.store;
    const deliver = store.deliverSummary.bind(store);
    const handing = deferred();
    const release = deferred();
    store.deliverSummary = async (input) => {
      handing.resolve();
      await release.promise;
      return deliver(input);
    };
    const pass = second.engine.recoverInterrupted();
    await handing.promise;
    const stopped = second.engine.cancel(id, w.accountId);
    release.resolve();
    expect((await mine(w, await pass)).resumed).toEqual([id]);
    const outcome = await stopped;
    expect(outcome.status).toBe("failed");
    expect(outcome.resultId).not.toBeNull();
    const delivered = await summaries(db.pool, w.parentSessionId);
    expect(delivered.map((d) => [d.id, d.outcome])).toEqual([[outcome.resultId, "error"]]);
    expect((await store.getWorkflow(id))?.status).toBe("failed");
  });

  it("a boot whose publication finds the generation moved on after the claim is refused and drives nothing", async () => {
    const w = await world(db.pool);
    const started = await interrupted(w);
    const taker = await w.engine(() => "never");
    all.push(taker.engine);
    const r = await taker.engine.recoverInterrupted(1000, {
      // A newer admission of the workflow commits between the claim and its resume.
      claimed: async (rows) => {
        if (rows.some((x) => x.id === started.workflowId))
          await db.pool.query("update workflows set generation = generation + 1 where id = $1::uuid", [
            started.workflowId,
          ]);
      },
    });
    expect(await mine(w, r)).toEqual({ resumed: [], invalid: [], refused: [started.workflowId] });
    expect(taker.engine.runIds()).not.toContain(started.workflowId);
    expect(await childCount(w)).toBe(1);
    expect(taker.events).toContainEqual({ type: "stale", workflowId: started.workflowId, generation: 1 });
  });

  it("a Stop recorded while the owner was dead cancels the workflow at boot: the running node is interrupted, nothing runs", async () => {
    const w = await world(db.pool);
    const started = await interrupted(w);
    const taker = await w.engine(() => "never");
    all.push(taker.engine);
    expect(await taker.engine.store.requestCancel(started.workflowId, w.accountId)).toBe(true);
    expect((await mine(w, await taker.engine.recoverInterrupted())).resumed).toEqual([started.workflowId]);
    const outcome = await taker.engine.finished(started.workflowId);
    expect(outcome.status).toBe("cancelled");
    expect(outcome.summary?.split("\n").slice(1)).toEqual([
      "- a: interrupted while running",
      "- b: cancelled before it started",
    ]);
    expect(await childCount(w)).toBe(1);
  });

  it("a boot continues only the running node, in its child, and never touches a succeeded one", async () => {
    const w = await world(db.pool);
    const first = await w.engine(async ({ task, signal }) =>
      taskLine(task) === "TASK b" ? untilAborted(signal) : `done ${taskLine(task)}`,
    );
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: chain });
    await until(() => first.engine.run(started.workflowId)?.started.has("b") === true, "b running");
    await first.engine.close();
    const calls: string[] = [];
    const second = await w.engine(({ task }) => `again ${taskLine(task)}`, {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => {
          if (r.workflowId === started.workflowId) calls.push(`create:${r.nodeId}`);
          return base.createChild(r);
        },
        runNode: (r) => {
          if (r.workflowId === started.workflowId) calls.push(`run:${r.nodeId}`);
          return base.runNode(r);
        },
        continueNode: (r, host) => {
          if (r.workflowId === started.workflowId) calls.push(`continue:${r.nodeId}`);
          return base.continueNode(r, host);
        },
      }),
    });
    all.push(second.engine);
    await second.engine.recoverInterrupted();
    expect((await second.engine.finished(started.workflowId)).status).toBe("completed");
    expect(calls).toEqual(["continue:b"]);
  });

  it("a node reserved (and charged) but never started before the crash is prepared again under its planned child, not charged twice", async () => {
    const w = await world(db.pool);
    const gate = deferred();
    const first = await w.engine(() => "never", {
      wrap: (base): NodeDispatcher => ({
        // The process dies while a's child is being created: the reservation is journaled, no child exists.
        createChild: async () => {
          await gate.promise;
          throw new Error("the process went away");
        },
        runNode: (r) => base.runNode(r),
        continueNode: (r, host) => base.continueNode(r, host),
      }),
    });
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: chain });
    const id = started.workflowId;
    await until(
      async () => (await journal(id).catch(() => null))?.nodes.a?.status === "reserved",
      "a reserved",
    );
    const before = await journal(id);
    const planned = before.nodes.a?.plannedChildId as string;
    expect(planned).toBeTruthy();
    expect(before.dispatches).toBe(1);
    const closing = first.engine.close();
    gate.resolve();
    await closing;
    expect((await journal(id)).nodes.a?.status).toBe("reserved");
    const ran: string[] = [];
    const second = await w.engine(({ task, sessionId }) => {
      ran.push(`${taskLine(task)}@${sessionId}`);
      return `done ${taskLine(task)}`;
    });
    all.push(second.engine);
    expect((await mine(w, await second.engine.recoverInterrupted())).resumed).toEqual([id]);
    const run = second.engine.run(id);
    expect((await second.engine.finished(id)).status).toBe("completed");
    // A completed workflow's journal is let go with its summary: the run's own is what it last wrote.
    const after = run?.journal as typeof before;
    expect(after.nodes.a?.childSessionId).toBe(planned);
    expect(ran.filter((r) => r.startsWith("TASK a@"))).toEqual([`TASK a@${planned}`]);
    expect(await childCount(w)).toBe(2);
    // a was charged once before the crash, b once after: a is not charged again.
    expect(after.dispatches).toBe(2);
  });

  it("a boot refusal at the workflow's own scope says so, and fails every unfinished node with it", async () => {
    const w = await world(db.pool);
    const first = await w.engine(({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const ctx = w.ctx({ access: { tools: { allow: ["Bash", "Read"] } } });
    const started = await first.engine.start(ctx, { definition: chain });
    await until(() => first.engine.run(started.workflowId)?.started.has("a") === true, "a running");
    await first.engine.close();
    await db.pool.query("update accounts set tool_allow = array['Read'] where id = $1::uuid", [w.accountId]);
    const second = await w.engine(() => "never");
    all.push(second.engine);
    expect((await mine(w, await second.engine.recoverInterrupted())).refused).toEqual([started.workflowId]);
    expect((await second.engine.finished(started.workflowId)).status).toBe("failed");
    const [report] = await summaries(db.pool, w.parentSessionId);
    const reason =
      "could not be resumed: journaled access exceeds current access (the workflow: tools: an allow-list entry is not fully covered by current access)";
    expect(report?.body.split("\n").slice(1)).toEqual([
      reason,
      `- a: failed: ${reason}`,
      `- b: failed: ${reason}`,
    ]);
    expect(await childCount(w)).toBe(1);
  });

  it("a boot refusal leaves a node that had succeeded as it was, and fails the unfinished ones with resume_refused", async () => {
    const w = await world(db.pool);
    const first = await w.engine(({ task, signal }) =>
      taskLine(task) === "TASK a" ? "done a" : untilAborted(signal),
    );
    all.push(first.engine);
    const ctx = w.ctx({ access: { tools: { allow: ["Bash", "Read"] } } });
    const twoFree = parseWorkflowDefinition(
      'name: two-free\nnodes:\n  - { id: a, task: "TASK a" }\n  - { id: b, task: "TASK b" }\n',
    );
    const started = await first.engine.start(ctx, { definition: twoFree });
    const id = started.workflowId;
    await until(async () => (await journal(id)).nodes.a?.status === "succeeded", "a succeeded");
    await first.engine.close();
    await db.pool.query("update accounts set tool_allow = array['Read'] where id = $1::uuid", [w.accountId]);
    const second = await w.engine(() => "never");
    all.push(second.engine);
    expect((await mine(w, await second.engine.recoverInterrupted())).refused).toEqual([id]);
    expect((await second.engine.finished(id)).status).toBe("failed");
    const kept = await journal(id);
    expect(kept.nodes.a?.status).toBe("succeeded");
    expect(kept.nodes.a?.error).toBeUndefined();
    expect(kept.nodes.b?.status).toBe("failed");
    expect(kept.nodes.b?.error?.code).toBe("resume_refused");
  });

  it("a node whose journaled scope exceeds current access refuses the boot naming that node, though the workflow's own fits", async () => {
    const w = await world(db.pool, { toolAllow: ["Read"] });
    const first = await w.engine(({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const started = await first.engine.start(w.ctx({ access: { tools: { allow: ["Read"] } } }), {
      definition: chain,
    });
    await until(() => first.engine.run(started.workflowId)?.started.has("a") === true, "a running");
    await first.engine.close();
    // a's journaled scope names a tool the account never granted (the workflow's own scope still fits).
    await db.pool.query(
      `update workflow_journal_nodes set body = jsonb_set(body, '{access}', to_jsonb(replace(body ->> 'access', '"Read"', '"Bash"')))
        where workflow_id = $1::uuid and node_id = 'a'`,
      [started.workflowId],
    );
    expect((await journal(started.workflowId)).nodeAccess.a).toContain('"Bash"');
    const second = await w.engine(() => "never");
    all.push(second.engine);
    expect((await mine(w, await second.engine.recoverInterrupted())).refused).toEqual([started.workflowId]);
    await second.engine.finished(started.workflowId);
    const [report] = await summaries(db.pool, w.parentSessionId);
    expect(report?.body.split("\n")[1]).toMatch(
      /^could not be resumed: journaled access exceeds current access \(node a: tools: .+\)$/,
    );
  });

  it("a boot whose current access cannot be read refuses the workflow with that reason and starts nothing", async () => {
    const w = await world(db.pool);
    const started = await interrupted(w);
    // The account cannot be read now: current access is unknown, which is no access.
    w.repo.getAccount = async () => {
      throw new Error("the account store is unavailable");
    };
    const second = await w.engine(() => "never");
    all.push(second.engine);
    expect((await mine(w, await second.engine.recoverInterrupted())).refused).toEqual([started.workflowId]);
    expect((await second.engine.finished(started.workflowId)).status).toBe("failed");
    const [report] = await summaries(db.pool, w.parentSessionId);
    expect(report?.body.split("\n")[1]).toBe(
      "could not be resumed: journaled access exceeds current access (the account store is unavailable)",
    );
    expect(await childCount(w)).toBe(1);
  });
});
