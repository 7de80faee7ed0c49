import { randomUUID } from "node:crypto";
import { realpath } from "node:fs/promises";
import { currentWorkflowNodeDispatch } from "@crw/subagent";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import {
  type OrchestrationJournal,
  parseWorkflowDefinition,
  type WorkflowEngineOptions,
  type WorkflowEvent,
} from "../src/index.js";
import {
  chainDefinition as chain,
  closeEnginesAfterEach,
  deferred,
  interruptedMidTurn,
  seeingChildren,
  taskLine,
  type World,
  world,
} from "./helpers.js";

/**
 * A node's preparation on a real database: the exact-admission assertion a boot continuation's host is
 * handed, the node's progress events, a Stop that lands before it starts, its model and working directory,
 * and the read grants of its dependencies' artifacts.
 */
const db = useTestDatabase();
const all = closeEnginesAfterEach();

/** What a refused assertion (or a failed node) says: its code, message and context. */
const described = (e: unknown) => {
  const error = e as { code?: unknown; message: string; context?: unknown };
  return { code: error.code, message: error.message, context: error.context };
};

/** The node_error events of `nodeId`, described. */
const nodeErrors = (events: WorkflowEvent[], nodeId: string) =>
  events.flatMap((e) => (e.type === "node_error" && e.nodeId === nodeId ? [e.error] : []));

/** The node status events of `nodeId`, in order. */
const statusesOf = (events: WorkflowEvent[], nodeId: string) =>
  events.flatMap((e) => (e.type === "node" && e.nodeId === nodeId ? [e.status] : []));

/** The native row as the assertion reads it (only the fields a probe changes are named). */
type Row = Record<string, unknown>;

/** `chain` with a interrupted mid-turn by a first engine, and a second engine (not yet recovering) to boot over it. */
async function bootingOverA() {
  const w = await world(db.pool);
  const started = await interruptedMidTurn(w, chain, "a");
  const second = await w.engine(({ task }) => `done ${taskLine(task)}`);
  all.push(second.engine);
  return { id: started.workflowId, second };
}

describe("a boot continuation's assertion", () => {
  it("refuses each way the admission lapses (another child, a stopped run, a journal or native row that moved on) and admits the exact one", async () => {
    const { id, second } = await bootingOverA();
    // The native row as the assertion reads it, changed by each probe below.
    let patch: (row: Row | null) => Row | null = (row) => row;
    const read = second.engine.store.currentWorkflow.bind(second.engine.store);
    second.engine.store.currentWorkflow = async (wid) =>
      patch((await read(wid)) as unknown as Row | null) as unknown as Awaited<ReturnType<typeof read>>;
    const verdicts: Record<string, unknown> = {};
    let child = "";
    await second.engine.recoverInterrupted(1000, {
      continueNode: async (input) => {
        const scope = currentWorkflowNodeDispatch();
        const assertDispatch = scope?.assertDispatch as (c: string) => Promise<void>;
        const j = second.engine.run(id)?.journal as OrchestrationJournal;
        const node = j.nodes.a as { childSessionId?: string };
        child = input.childSessionId;
        const other = randomUUID();
        const probe = async (name: string, asked: string, change: () => () => void) => {
          const undo = change();
          try {
            await assertDispatch(asked);
            verdicts[name] = "admitted";
          } catch (e) {
            verdicts[name] = described(e);
          } finally {
            undo();
          }
        };
        const nothing = () => () => undefined;
        const journalChild = (to: string) => () => {
          node.childSessionId = to;
          return () => {
            node.childSessionId = child;
          };
        };
        const row = (change: (r: Row) => Row | null) => () => {
          patch = (r) => (r ? change(r) : r);
          return () => {
            patch = (r) => r;
          };
        };
        const recovery = (r: Row, change: Record<string, number>) => ({
          ...r,
          recovery: { ...(r.recovery as object), ...change },
        });
        const versions = j.recovery;
        await probe("exact", child, nothing);
        await probe("another child", other, nothing);
        await probe("the journal names another child", child, journalChild(other));
        await probe("asked for the journal's other child", other, journalChild(other));
        await probe("cancel requested", child, () => {
          j.cancelRequested = true;
          return () => {
            j.cancelRequested = false;
          };
        });
        for (const key of ["workflowGeneration", "recoveryAdmissionVersion"] as const)
          await probe(`journal ${key}`, child, () => {
            const was = versions[key];
            versions[key] = was + 1;
            return () => {
              versions[key] = was;
            };
          });
        await probe(
          "no native row",
          child,
          row(() => null),
        );
        await probe(
          "native row paused",
          child,
          row((r) => ({ ...r, status: "paused" })),
        );
        await probe(
          "native row held by another owner",
          child,
          row((r) => ({ ...r, lockedBy: "another" })),
        );
        await probe(
          "native row at another generation",
          child,
          row((r) => recovery(r, { workflowGeneration: versions.workflowGeneration + 1 })),
        );
        await probe(
          "native row at a newer admission",
          child,
          row((r) => recovery(r, { recoveryAdmissionVersion: versions.recoveryAdmissionVersion + 1 })),
        );
        await probe(
          "native row at an older admission",
          child,
          row((r) => recovery(r, { recoveryAdmissionVersion: versions.recoveryAdmissionVersion - 1 })),
        );
        // Last: a Stop another process recorded is honoured as this process's own.
        await probe(
          "a Stop recorded elsewhere",
          child,
          row((r) => ({ ...r, cancelRequested: true })),
        );
        return { status: "answered", reply: "late" };
      },
    });
    expect((await second.engine.finished(id)).status).toBe("cancelled");
    const context = { workflowId: id, nodeId: "a" };
    const mismatch = (asked: string) => ({
      code: "child_mismatch",
      message: `node a: ${asked} is not its child`,
      context,
    });
    const stale = (why: string) => ({
      code: "stale_generation",
      message: `node a: its continuation is no longer admitted (${why})`,
      context,
    });
    const other = (verdicts["another child"] as { message: string }).message.split(" ")[2] as string;
    expect(verdicts).toEqual({
      exact: "admitted",
      "another child": mismatch(other),
      "the journal names another child": mismatch(child),
      "asked for the journal's other child": mismatch(other),
      "cancel requested": stale("the run stopped"),
      "journal workflowGeneration": stale("the journal moved on"),
      "journal recoveryAdmissionVersion": stale("the journal moved on"),
      "no native row": stale("the native record moved on"),
      "native row paused": stale("the native record moved on"),
      "native row held by another owner": stale("the native record moved on"),
      "native row at another generation": stale("the native record moved on"),
      "native row at a newer admission": stale("the native record moved on"),
      "native row at an older admission": "admitted",
      "a Stop recorded elsewhere": stale("a Stop was recorded"),
    });
  });
});

describe("a node's progress", () => {
  it("reaches the host as a node_progress event naming the workflow and the node", async () => {
    const w = await world(db.pool);
    // The scripted turn reports its answer as it streams: the host sees that, attributed to the node.
    const { engine, events } = await w.engine(() => "done");
    all.push(engine);
    const one = parseWorkflowDefinition('name: one\nnodes:\n  - { id: x, task: "TASK x" }\n');
    const started = await engine.start(w.ctx(), { definition: one });
    expect((await engine.finished(started.workflowId)).status).toBe("completed");
    expect(events.filter((e) => e.type === "node_progress")).toEqual([
      {
        type: "node_progress",
        workflowId: started.workflowId,
        nodeId: "x",
        event: { type: "text", text: "done" },
      },
    ]);
  });
});

describe("a Stop before a node starts", () => {
  it("during its preparation leaves the node cancelled once, with no child", async () => {
    const project = await realpath(scratchDir("crw-prep-proj-"));
    const w = await world(db.pool);
    const entered = deferred();
    const gate = deferred();
    const created: string[] = [];
    const { engine, events } = await w.engine(() => "done", {
      workDirPolicy: async () => ({ kind: "scoped", project: { ref: "proj", root: project } }),
      admitNodeWorkDir: async () => {
        entered.resolve();
        await gate.promise;
      },
      wrap: seeingChildren((r) => created.push(r.nodeId)),
    });
    all.push(engine);
    const def = parseWorkflowDefinition(
      `name: placed\nnodes:\n  - { id: a, task: "TASK a", cwd: ${project} }\n`,
    );
    const started = await engine.start(
      w.ctx({
        access: { target: { kind: "host", ref: "proj" }, projectRef: "proj" },
        currentWorkDir: async () => project,
      }),
      { definition: def },
    );
    await entered.promise;
    const cancelled = engine.run(started.workflowId)?.cancel();
    gate.resolve();
    expect((await cancelled)?.status).toBe("cancelled");
    expect(statusesOf(events, "a")).toEqual(["reserved", "cancelled"]);
    expect(created).toEqual([]);
  });

  it("while its dependencies' grants are minted after a boot: the node the Stop found running is cancelled, not interrupted", async () => {
    const { id, second } = await bootingOverA();
    const granting = deferred();
    const gate = deferred();
    const grantMany = second.engine.artifacts.grantMany.bind(second.engine.artifacts);
    second.engine.artifacts.grantMany = async (...args) => {
      granting.resolve();
      await gate.promise;
      return grantMany(...args);
    };
    await second.engine.recoverInterrupted();
    await granting.promise;
    const run = second.engine.run(id);
    const cancelled = run?.cancel();
    // The rebuilt run's Stop marks b, running but not yet started, interrupted.
    expect(run?.journal.nodes.b?.status).toBe("interrupted");
    gate.resolve();
    expect((await cancelled)?.status).toBe("cancelled");
    expect(statusesOf(second.events, "b").at(-1)).toBe("cancelled");
  });
});

describe("a node's model", () => {
  it("is its own when set (its agent type's pin aside), else its type's pin made once, else the default; no pin without a type", async () => {
    const w = await world(db.pool);
    const models: Record<string, string> = {};
    let pins: Record<string, string> = {};
    let workflowId = "";
    const { engine } = await w.engine(() => "done", {
      wrap: seeingChildren((r) => {
        models[r.nodeId] = r.model;
        pins = { ...engine.run(workflowId)?.journal.typeModelPins };
      }),
    });
    all.push(engine);
    const def = parseWorkflowDefinition(`
name: models
agentTypes: { pinned: { model: pinned-model } }
nodes:
  - { id: own, task: "TASK own", agentType: pinned, model: own-model }
  - { id: typed, task: "TASK typed", agentType: pinned }
  - { id: fresh, task: "TASK fresh", agentType: unpinned, dependsOn: [own, typed] }
  - { id: plain, task: "TASK plain", dependsOn: [fresh] }
`);
    const started = await engine.start(w.ctx(), { definition: def });
    workflowId = started.workflowId;
    expect((await engine.finished(workflowId)).status).toBe("completed");
    expect(models).toEqual({ own: "own-model", typed: "pinned-model", fresh: "scripted", plain: "scripted" });
    expect(pins).toEqual({ pinned: "pinned-model", unpinned: "scripted" });
  });
});

/** Starts `definition` on an engine with `options` and returns the node errors and children's scopes. */
async function prepared(
  w: World,
  definition: string,
  options: Partial<WorkflowEngineOptions> = {},
  ctx = {},
) {
  const scopes: Record<string, { workDir?: string | null }> = {};
  const { engine, events } = await w.engine(() => "done", {
    ...options,
    wrap: seeingChildren((r) => {
      scopes[r.nodeId] = JSON.parse(r.scope);
    }),
  });
  all.push(engine);
  const started = await engine.start(w.ctx(ctx), { definition: parseWorkflowDefinition(definition) });
  const outcome = await engine.finished(started.workflowId);
  return { workflowId: started.workflowId, outcome, events, scopes };
}

describe("a node's working directory", () => {
  it("a node cwd, or a worktree, on a host without a placement policy fails with work_dir_not_permitted", async () => {
    const w = await world(db.pool);
    const { workflowId, events } = await prepared(
      w,
      'name: p\nnodes:\n  - { id: c, task: "TASK c", cwd: /tmp }\n  - { id: i, task: "TASK i", isolation: worktree }\n',
    );
    for (const nodeId of ["c", "i"])
      expect(nodeErrors(events, nodeId).map(described)).toEqual([
        {
          code: "work_dir_not_permitted",
          message: `node ${nodeId} could not be prepared: this host cannot place a node in a working directory`,
          context: { workflowId, nodeId },
        },
      ]);
  });

  it("a refusal without a code of its own fails the node with node_preparation_failed", async () => {
    const project = await realpath(scratchDir("crw-prep-proj-"));
    const w = await world(db.pool);
    const { workflowId, events } = await prepared(
      w,
      `name: p\nnodes:\n  - { id: c, task: "TASK c", cwd: ${project} }\n`,
      {
        workDirPolicy: async () => ({ kind: "scoped", project: { ref: "proj", root: project } }),
        admitNodeWorkDir: async () => {
          throw new Error("the host said no");
        },
      },
      {
        access: { target: { kind: "host", ref: "proj" }, projectRef: "proj" },
        currentWorkDir: async () => project,
      },
    );
    expect(nodeErrors(events, "c").map(described)).toEqual([
      {
        code: "node_preparation_failed",
        message: "node c could not be prepared: the host said no",
        context: { workflowId, nodeId: "c" },
      },
    ]);
  });

  it("on a local target is the node's own path as written; elsewhere a relative one is resolved against / when the workflow has no cwd", async () => {
    const w = await world(db.pool);
    const local = await prepared(w, 'name: p\nnodes:\n  - { id: c, task: "TASK c", cwd: "C:\\\\work" }\n', {
      workDirPolicy: async () => ({ kind: "local", targetId: "laptop" }),
    });
    expect(local.outcome.status).toBe("completed");
    expect(local.scopes.c?.workDir).toBe("C:\\work");
    const managed = await prepared(w, 'name: p\nnodes:\n  - { id: c, task: "TASK c", cwd: work }\n', {
      workDirPolicy: async () => ({ kind: "managed", ref: "box", guestRoot: "/" }),
    });
    expect(managed.outcome.status).toBe("completed");
    expect(managed.scopes.c?.workDir).toBe("/work");
  });
});

describe("a node's dependency grants", () => {
  it("a dependency's artifact no longer stored fails the node before its turn, naming the artifact", async () => {
    const w = await world(db.pool);
    const turns: string[] = [];
    const { engine, events } = await w.engine(({ task }) => {
      turns.push(taskLine(task));
      return `done ${taskLine(task)}`;
    });
    all.push(engine);
    const grantMany = engine.artifacts.grantMany.bind(engine.artifacts);
    engine.artifacts.grantMany = async (workflowId, wanted, recipient) => {
      await db.pool.query("delete from workflow_artifacts where workflow_id = $1::uuid", [workflowId]);
      return grantMany(workflowId, wanted, recipient);
    };
    const started = await engine.start(w.ctx(), { definition: chain });
    expect((await engine.finished(started.workflowId)).status).toBe("failed");
    expect(turns).toEqual(["TASK a"]);
    const errors = nodeErrors(events, "b");
    expect(errors.map(described)).toEqual([
      {
        code: "node_preparation_failed",
        message: "the artifact of a is not stored",
        context: { workflowId: started.workflowId, nodeId: "b" },
      },
    ]);
    expect(String((errors[0]?.cause as Error | undefined)?.message)).toMatch(/^no artifact a@[0-9a-f]{64}$/);
  });

  it("a dependency that stored no artifact (its run kept none) is granted nothing and the node runs", async () => {
    const project = await realpath(scratchDir("crw-prep-proj-"));
    const w = await world(db.pool);
    const placed = {
      workDirPolicy: async () => ({ kind: "scoped" as const, project: { ref: "proj", root: project } }),
    };
    const ctx = w.ctx({
      access: { target: { kind: "host", ref: "proj" }, projectRef: "proj" },
      currentWorkDir: async () => project,
    });
    const def = parseWorkflowDefinition(`
name: kept
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", cwd: ${project}, dependsOn: [a] }
`);
    // A first process without shared artifacts answers a, and stops while b is being prepared.
    const preparing = deferred();
    const gate = deferred();
    const first = await w.engine(({ task }) => `done ${taskLine(task)}`, {
      ...placed,
      sharedArtifacts: false,
      admitNodeWorkDir: async () => {
        preparing.resolve();
        await gate.promise;
      },
    });
    const started = await first.engine.start(ctx, { definition: def });
    await preparing.promise;
    const closed = first.engine.close();
    gate.resolve();
    await closed;
    const children: string[] = [];
    const second = await w.engine(({ sessionId, task }) => {
      children.push(sessionId);
      return `done ${taskLine(task)}`;
    }, placed);
    all.push(second.engine);
    await second.engine.recoverInterrupted();
    expect((await second.engine.finished(started.workflowId)).status).toBe("completed");
    expect(children).toHaveLength(1);
    expect(await second.engine.artifacts.grantsOf(children[0] as string)).toEqual([]);
  });
});
