import { execFileSync } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import {
  type NodeContinueRequest,
  type NodeDispatcher,
  parseWorkflowDefinition,
  type WorkflowEmitter,
  type WorkflowEngine,
} from "../src/index.js";
import {
  closeEnginesAfterEach,
  deferred,
  interruptedMidTurn,
  nativeEmitter,
  storeWholeJournal,
  taskLine,
  until,
  workflowJournal,
  world,
} from "./helpers.js";

/**
 * One node's execution on a real database: what a fresh reservation may start (nothing once its run is
 * superseded, let go of or stopped), the planned child id of an old reservation, an isolated node's
 * worktree, what a continuation writes and is handed, and how a node's error is stored.
 */
const db = useTestDatabase();
const all = closeEnginesAfterEach();

const journal = (workflowId: string) => workflowJournal(db.pool, workflowId);
/**
 * A node's child as the workflow's published snapshot names it: a finished run is no longer the engine's to
 * hand out, and a completed workflow's journal is not kept.
 */
const snapshotChild = async (workflowId: string, nodeId: string): Promise<string | undefined> => {
  const { rows } = await db.pool.query("select snapshot from workflows where id = $1::uuid", [workflowId]);
  const nodes = (rows[0]?.snapshot?.nodes ?? []) as Array<{ id: string; childSessionId?: string }>;
  return nodes.find((n) => n.id === nodeId)?.childSessionId;
};
const published: WorkflowEmitter = (u, expected) => nativeEmitter(db.pool)(u, expected);

/** The base dispatcher, with every child it is asked to create recorded (node id and planned child id). */
function recordingChildren(created: Array<{ nodeId: string; childSessionId?: string }>) {
  return (base: NodeDispatcher): NodeDispatcher => ({
    createChild: (r) => {
      created.push({ nodeId: r.nodeId, ...(r.childSessionId ? { childSessionId: r.childSessionId } : {}) });
      return base.createChild(r);
    },
    runNode: (r) => base.runNode(r),
    continueNode: (r, host) => base.continueNode(r, host),
  });
}

/** The base dispatcher, with every continuation's input recorded before it runs. */
function recordingContinuations(inputs: NodeContinueRequest[]) {
  return (base: NodeDispatcher): NodeDispatcher => ({
    createChild: (r) => base.createChild(r),
    runNode: (r) => base.runNode(r),
    continueNode: (input, host) => {
      inputs.push(input);
      return base.continueNode(input, host);
    },
  });
}

/** A project directory the nodes may be placed in (a scoped host policy over it). */
function placedIn(project: string) {
  return {
    workDirPolicy: async () => ({ kind: "scoped" as const, project: { ref: "proj", root: project } }),
  };
}
const inProject = (project: string) => ({
  access: { target: { kind: "host" as const, ref: "proj" }, projectRef: "proj" },
  currentWorkDir: async () => project,
});

/** Counts the journal writes of each workflow through `engine`'s store; `before` runs ahead of each one. */
function journalWrites(engine: WorkflowEngine, before?: (workflowId: string, nth: number) => Promise<void>) {
  const counts = new Map<string, number>();
  const store = engine.store;
  const write = store.writeJournalText.bind(store);
  store.writeJournalText = async (workflowId, ...rest) => {
    const nth = (counts.get(workflowId) ?? 0) + 1;
    counts.set(workflowId, nth);
    await before?.(workflowId, nth);
    return write(workflowId, ...rest);
  };
  return (workflowId: string) => counts.get(workflowId) ?? 0;
}

const placedNode = parseWorkflowDefinition(`
name: placed
nodes:
  - { id: a, task: "TASK a", cwd: "." }
`);

/** Starts `placedNode` in a project, recording each placement admitted (then `admit` awaited) and child created. */
async function startPlaced(options: { emitter?: WorkflowEmitter; admit?: () => Promise<void> } = {}) {
  const project = scratchDir("crw-exec-");
  const w = await world(db.pool);
  const admitted: string[] = [];
  const created: Array<{ nodeId: string }> = [];
  const { engine, events } = await w.engine(() => "unused", {
    ...placedIn(project),
    ...(options.emitter ? { emitter: options.emitter } : {}),
    admitNodeWorkDir: async (_j, placement) => {
      admitted.push(placement.workDir);
      await options.admit?.();
    },
    wrap: recordingChildren(created),
  });
  all.push(engine);
  const started = await engine.start(w.ctx(inProject(project)), { definition: placedNode });
  const id = started.workflowId;
  return { w, engine, events, id, run: engine.run(id), admitted, created };
}

describe("a fresh reservation", () => {
  it("whose publication is refused as stale prepares nothing and creates no child: a newer run owns the workflow", async () => {
    const refuse = deferred();
    const { events, run, admitted, created } = await startPlaced({
      emitter: async (u, expected) => {
        if (!u.snapshot.nodes.some((n) => n.status === "reserved")) return published(u, expected);
        await refuse.promise;
        return { status: "stale" };
      },
    });
    refuse.resolve();
    expect((await run?.finished)?.status).toBeNull();
    await until(() => run?.active.size === 0, "the node's execution ended");
    expect(events.some((e) => e.type === "stale")).toBe(true);
    expect(admitted).toEqual([]);
    expect(created).toEqual([]);
  });

  it("of a node cancelled while its reservation is published is never prepared", async () => {
    const publishing = deferred();
    const hold = deferred();
    const { w, engine, id, admitted, created } = await startPlaced({
      emitter: async (u, expected) => {
        if (u.snapshot.nodes.some((n) => n.status === "reserved")) {
          publishing.resolve();
          await hold.promise;
        }
        return published(u, expected);
      },
    });
    await publishing.promise;
    const outcome = engine.cancel(id, w.accountId);
    hold.resolve();
    expect((await outcome).status).toBe("cancelled");
    expect(admitted).toEqual([]);
    expect(created).toEqual([]);
  });

  for (const how of ["its run is let go of", "a Stop arrives"] as const) {
    it(`creates no child when ${how} while the node is being prepared`, async () => {
      const placing = deferred();
      const hold = deferred();
      const { w, engine, id, run, created } = await startPlaced({
        admit: async () => {
          placing.resolve();
          await hold.promise;
        },
      });
      await placing.promise;
      const ending = how === "a Stop arrives" ? engine.cancel(id, w.accountId) : engine.close();
      hold.resolve();
      await ending;
      await until(() => run?.active.size === 0, "the node's execution ended");
      expect(created).toEqual([]);
      if (how === "a Stop arrives") expect((await journal(id)).nodes.a?.status).toBe("cancelled");
    });
  }

  it("journaled before planned child ids existed gets one planned and journaled before its child is inserted", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition('name: old-reservation\nnodes:\n  - { id: a, task: "TASK a" }\n');
    const started = await interruptedMidTurn(w, def, "a");
    const id = started.workflowId;
    // The layout an older process left: a reserved node with neither a child nor a planned child id.
    const old = await journal(id);
    const a = old.nodes.a as { status: string; childSessionId?: string; plannedChildId?: string };
    a.status = "reserved";
    delete a.childSessionId;
    delete a.plannedChildId;
    await storeWholeJournal(db.pool, id, old);
    // What each insert asked for, beside what the journal held at that moment.
    const inserted: Array<{ requested: string | undefined; journaled: string | undefined }> = [];
    const second = await w.engine(({ task }) => `done ${taskLine(task)}`, {
      wrap: (base): NodeDispatcher => ({
        createChild: async (r) => {
          if (r.workflowId === id) {
            const journaled = (await journal(id)).nodes.a?.plannedChildId;
            inserted.push({ requested: r.childSessionId, journaled });
          }
          return base.createChild(r);
        },
        runNode: (r) => base.runNode(r),
        continueNode: (r, host) => base.continueNode(r, host),
      }),
    });
    all.push(second.engine);
    await second.engine.recoverInterrupted();
    await until(() => inserted.length > 0, "the node's child inserted", 5_000);
    expect((await second.engine.finished(id)).status).toBe("completed");
    expect(inserted).toHaveLength(1);
    const planned = inserted[0]?.requested;
    expect(planned).toMatch(/^[0-9a-f-]{36}$/);
    expect(inserted[0]?.journaled).toBe(planned);
    expect(await snapshotChild(id, "a")).toBe(planned);
  });

  it("of an isolated node remembers its worktree against the child once the child exists, on a branch named by its planned child", async () => {
    const repo = scratchDir("crw-exec-repo-");
    const git = (...args: string[]) =>
      execFileSync("git", ["-c", "user.email=t@example.com", "-c", "user.name=t", ...args], { cwd: repo });
    git("init", "-q", "-b", "main");
    await writeFile(join(repo, "README.md"), "hello\n");
    git("add", ".");
    git("commit", "-q", "-m", "init");
    const w = await world(db.pool);
    const { engine } = await w.engine(({ task }) => `done ${taskLine(task)}`, {
      ...placedIn(repo),
      worktreesDir: scratchDir("crw-exec-worktrees-"),
    });
    all.push(engine);
    const def = parseWorkflowDefinition(
      'name: isolated\nnodes:\n  - { id: a, task: "TASK a", isolation: worktree }\n',
    );
    const started = await engine.start(w.ctx(inProject(repo)), { definition: def });
    expect((await engine.finished(started.workflowId)).status).toBe("completed");
    const child = await snapshotChild(started.workflowId, "a");
    expect(child).toMatch(/^[0-9a-f-]{36}$/);
    const { rows } = await db.pool.query(
      "select node_id, session_id::text, branch from isolated_worktrees where workflow_id = $1::uuid",
      [started.workflowId],
    );
    // The worktree was made before the child existed: its branch is named by the id the child was planned under.
    expect(rows).toEqual([{ node_id: "a", session_id: child, branch: `crw/${child?.slice(0, 8)}` }]);
  });
});

const oneNode = parseWorkflowDefinition(
  'name: one\nnodes:\n  - { id: a, task: "TASK a", model: pinned-model }\n',
);

describe("a continuation", () => {
  it("at boot, of a node journaled running, writes nothing before it continues, with the node's journaled model and scope", async () => {
    const w = await world(db.pool);
    const started = await interruptedMidTurn(w, oneNode, "a");
    const id = started.workflowId;
    const before = await journal(id);
    const inputs: NodeContinueRequest[] = [];
    // The continued turn answers only once the writes before it are counted.
    const counted = deferred();
    const second = await w.engine(
      async () => {
        await counted.promise;
        return "finished";
      },
      { wrap: recordingContinuations(inputs) },
    );
    all.push(second.engine);
    const writes = journalWrites(second.engine);
    await second.engine.recoverInterrupted();
    await until(() => inputs.some((i) => i.workflowId === id), "a continued");
    const writesBeforeContinuing = writes(id);
    counted.resolve();
    expect((await second.engine.finished(id)).status).toBe("completed");
    expect(writesBeforeContinuing).toBe(0);
    const own = inputs.filter((i) => i.workflowId === id);
    expect(own).toHaveLength(1);
    expect(own[0]?.model).toBe("pinned-model");
    expect(before.nodeAccess.a).toBeTruthy();
    expect(own[0]?.scope).toBe(before.nodeAccess.a);
  });

  it("of an explicit resume whose running write is refused continues nothing: another owner holds the workflow", async () => {
    const w = await world(db.pool);
    let turns = 0;
    const inputs: NodeContinueRequest[] = [];
    const { engine, events } = await w.engine(
      () => {
        turns++;
        if (turns === 1) throw new Error("flaky provider");
        return "finished";
      },
      { wrap: recordingContinuations(inputs) },
    );
    all.push(engine);
    const ctx = w.ctx();
    const started = await engine.start(ctx, { definition: oneNode });
    const id = started.workflowId;
    expect((await engine.finished(id)).status).toBe("failed");
    let resumed = false;
    // The resume's own write goes through; then another owner takes the row before the node's write.
    journalWrites(engine, async (workflowId, nth) => {
      if (workflowId === id && resumed && nth === 2)
        await db.pool.query("update workflows set locked_by = 'another-owner' where id = $1::uuid", [id]);
    });
    resumed = true;
    await engine.resume({ ...ctx, toolCallId: "resume-call" }, id);
    const run = engine.run(id);
    await until(() => events.some((e) => e.type === "stale" && e.workflowId === id), "the run superseded");
    await until(() => run?.active.size === 0, "the node's execution ended");
    expect(inputs).toEqual([]);
    expect(turns).toBe(1);
  });
});

describe("a node's error", () => {
  it("without a string code is stored as node_error, its message cut at 4,000 characters", async () => {
    const w = await world(db.pool);
    const long = "x".repeat(5_000);
    const { engine, events } = await w.engine(() => "unused", {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        runNode: async () => {
          throw Object.assign(new Error(long), { code: 42 });
        },
        continueNode: (r, host) => base.continueNode(r, host),
      }),
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNode });
    expect((await engine.finished(started.workflowId)).status).toBe("failed");
    const stored = (await journal(started.workflowId)).nodes.a?.error;
    expect(stored?.code).toBe("node_error");
    expect(stored?.message).toBe("x".repeat(4_000));
    // the event keeps the original error whole
    const reported = events.find((e) => e.type === "node_error");
    expect(reported?.type === "node_error" && reported.error.message).toBe(long);
  });

  it("of a failed turn is stored with its message cut at 4,000 characters: the kept journal stays readable", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(() => {
      throw new Error("y".repeat(5_000));
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNode });
    expect((await engine.finished(started.workflowId)).status).toBe("failed");
    const stored = (await journal(started.workflowId)).nodes.a?.error;
    expect(stored?.code).toBe("node_turn_failed");
    expect(stored?.message).toHaveLength(4_000);
    expect(stored?.message).toMatch(/^(.*)y{100}/);
  });

  it("of a failed turn whose host names a long error code is stored with the code cut at 100 characters", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(() => "unused", {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        runNode: async () => ({ status: "failed", error: { code: "c".repeat(150), message: "refused" } }),
        continueNode: (r, host) => base.continueNode(r, host),
      }),
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNode });
    expect((await engine.finished(started.workflowId)).status).toBe("failed");
    const stored = (await journal(started.workflowId)).nodes.a?.error;
    expect(stored).toEqual({ code: "c".repeat(100), message: "refused" });
  });

  it("after its outcome was written, without a cancel, is still reported and stored", async () => {
    const w = await world(db.pool);
    let thrown = false;
    const emitter: WorkflowEmitter = async (u, expected) => {
      const a = u.snapshot.nodes.find((n) => n.id === "a")?.status;
      if (a === "succeeded" && u.status === "running" && !thrown) {
        thrown = true;
        throw new Error("the record is unavailable");
      }
      return published(u, expected);
    };
    const { engine, events } = await w.engine(({ task }) => `done ${taskLine(task)}`, { emitter });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNode });
    const outcome = await engine.finished(started.workflowId);
    expect(thrown).toBe(true);
    const reported = events.find((e) => e.type === "node_error" && e.nodeId === "a");
    expect(reported?.type === "node_error" && reported.error.message).toBe("the record is unavailable");
    expect(outcome.status).toBe("failed");
    expect(outcome.summary).toContain("the record is unavailable");
  });
});
