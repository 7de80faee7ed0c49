import { randomUUID } from "node:crypto";
import { createScriptedTurnRunner, DelegationService, FileSpillStore, scriptTask } from "@crw/brain";
import { PgDelegationRepository } from "@crw/db";
import {
  currentWorkflowNodeDispatch,
  type HostWorkflowNodeDispatch,
  MemoryRetryPolicySource,
  runWithWorkflowNodeDispatch,
  SubagentRunnerPool,
  SubagentSessionDispatch,
} from "@crw/subagent";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { beforeAll, describe, expect, it } from "vitest";
import {
  delegationNodeTurns,
  hostAccessors,
  JournalNodeDispatcher,
  type NodeDispatcher,
  type NodeRunResult,
  parseWorkflowDefinition,
  type RecoveryContinueNode,
  WorkflowEngine,
  type WorkflowEvent,
} from "../src/index.js";
import {
  closeEnginesAfterEach,
  interruptedMidTurn,
  taskLine,
  until,
  untilAborted,
  type World,
  workflowJournal,
  world,
} from "./helpers.js";

/**
 * The host-only workflow dispatch scope (`HostWorkflowNodeDispatch`, @crw/subagent's AsyncLocalStorage):
 * the engine's automatic missing-child recovery (a boot continuation) runs its continuation inside it,
 * naming the workflow's parent, its channel and the exact child, with the engine's exact-admission
 * assertion; fresh dispatches and the live caller (explicit WorkflowResume) never do.
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

type Seen = { node: string; scope: HostWorkflowNodeDispatch | undefined };

/** `a` interrupted mid-turn in a first engine: what a second engine boots over. */
const interrupted = (w: World) => interruptedMidTurn(w, chain, "a");

describe("the host-only workflow dispatch scope", () => {
  it("a boot continuation runs inside the scope (parent, channel, exact child, an assertion); fresh dispatches and the live WorkflowResume never do (S004-352 S004-355 S004-361)", async () => {
    const w = await world(db.pool);
    const started = await interrupted(w);
    const childA = (await journal(started.workflowId)).nodes.a?.childSessionId;
    const seen: Seen[] = [];
    const second = await w.engine(({ task }) => {
      seen.push({ node: taskLine(task), scope: currentWorkflowNodeDispatch() });
      return `done ${taskLine(task)}`;
    });
    all.push(second.engine);
    await second.engine.recoverInterrupted();
    expect((await second.engine.finished(started.workflowId)).status).toBe("completed");
    const a = seen.find((s) => s.node === "TASK a") as Seen;
    const b = seen.find((s) => s.node === "TASK b") as Seen;
    // The continuation of a (automatic recovery of its existing child) ran inside the exact scope.
    expect(a.scope).toMatchObject({
      parentSessionId: w.parentSessionId,
      channelId: w.parentSessionId,
      childSessionId: childA,
    });
    expect(typeof a.scope?.assertDispatch).toBe("function");
    expect(Object.isFrozen(a.scope)).toBe(true);
    // b was a fresh dispatch (after a's result): no scope.
    expect(b.scope).toBeUndefined();
    // Outside any turn there is no scope either: nothing is kept after the continuation.
    expect(currentWorkflowNodeDispatch()).toBeUndefined();

    // The live caller: an explicit WorkflowResume retries a failed node with no scope and no fresh callback.
    let fail = true;
    const live: Seen[] = [];
    const retried: Array<{ startFresh: unknown }> = [];
    const third = await w.engine(
      ({ task }) => {
        live.push({ node: taskLine(task), scope: currentWorkflowNodeDispatch() });
        if (fail) throw new Error("provider down");
        return `done ${taskLine(task)}`;
      },
      {
        wrap: (base): NodeDispatcher => ({
          createChild: (r) => base.createChild(r),
          runNode: (r) => base.runNode(r),
          continueNode: (input, host) => {
            retried.push({ startFresh: host?.startFresh });
            return base.continueNode(input, host);
          },
        }),
      },
    );
    all.push(third.engine);
    const one = parseWorkflowDefinition('name: one\nnodes:\n  - { id: x, task: "TASK x" }\n');
    const s2 = await third.engine.start(w.ctx(), { definition: one });
    expect((await third.engine.finished(s2.workflowId)).status).toBe("failed");
    fail = false;
    await third.engine.resume(w.ctx({ toolCallId: `call-${randomUUID()}` }), s2.workflowId);
    expect((await third.engine.finished(s2.workflowId)).status).toBe("completed");
    expect(retried).toEqual([{ startFresh: undefined }]);
    expect(live.map((l) => l.scope)).toEqual([undefined, undefined]);
  });

  it("concurrent continuations each see only their own child in the scope (async context, no shared store or callback map) (S004-353)", async () => {
    const w = await world(db.pool);
    const wide = parseWorkflowDefinition(`
name: wide
nodes:
  - { id: p, task: "TASK p" }
  - { id: q, task: "TASK q" }
  - { id: r, task: "TASK r" }
`);
    const first = await w.engine(({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: wide });
    await until(() => first.engine.run(started.workflowId)?.started.size === 3, "all running");
    await first.engine.close();
    const seen: Array<{ session: string; child: string | undefined }> = [];
    let arrived = 0;
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    const second = await w.engine(async ({ sessionId, task }) => {
      const before = currentWorkflowNodeDispatch()?.childSessionId;
      // All three are in flight together here; each still sees its own child after the others ran.
      arrived += 1;
      if (arrived < 3) await gate;
      else release();
      seen.push({ session: sessionId, child: currentWorkflowNodeDispatch()?.childSessionId });
      expect(before).toBe(sessionId);
      return `done ${taskLine(task)}`;
    });
    all.push(second.engine);
    await second.engine.recoverInterrupted();
    expect((await second.engine.finished(started.workflowId)).status).toBe("completed");
    expect(seen).toHaveLength(3);
    for (const s of seen) expect(s.child).toBe(s.session);
  });

  it("the assertion is awaited before the dispatcher prepares anything; a superseded admission refuses and prepares nothing (S004-365 S004-352)", async () => {
    const w = await world(db.pool);
    const log: string[] = [];
    const host: RecoveryContinueNode = async (_input, h) => {
      log.push("continue");
      const task = await h?.startFresh?.();
      log.push(`startFresh:${taskLine(task ?? "")}`);
      return { status: "answered", reply: "ok" } satisfies NodeRunResult;
    };
    const started = await interrupted(w);
    const child = (await journal(started.workflowId)).nodes.a?.childSessionId as string;
    const entries = async () =>
      (
        await db.pool.query("select count(*)::int n from journal_entries where session_id = $1::uuid", [
          child,
        ])
      ).rows[0].n as number;
    const before = await entries();
    /** A booting engine whose assertion's native query (the row read: the engine reads it for nothing else) is logged. */
    const booting = async (onRead: (id: string) => Promise<void> = async () => undefined) => {
      const booted = await w.engine(({ task }) => `done ${taskLine(task)}`);
      all.push(booted.engine);
      const read = booted.engine.store.currentWorkflow.bind(booted.engine.store);
      booted.engine.store.currentWorkflow = async (id) => {
        log.push("assert");
        await onRead(id);
        return read(id);
      };
      return booted;
    };
    // Another admission supersedes this boot's in the native record before its assertion reads the row: the
    // assertion refuses before anything is prepared, and the run stops driving the workflow.
    let superseded = false;
    const second = await booting(async (id) => {
      if (superseded) return;
      superseded = true;
      await db.pool.query(
        "update workflows set recovery_admission_version = recovery_admission_version + 1 where id = $1::uuid",
        [id],
      );
    });
    await second.engine.recoverInterrupted(1000, { continueNode: host });
    expect((await second.engine.finished(started.workflowId)).status).toBeNull();
    expect(second.events.some((e) => e.type === "run_lost" && e.workflowId === started.workflowId)).toBe(
      true,
    );
    expect(log).toEqual(["assert"]);
    expect((await journal(started.workflowId)).nodes.a?.status).toBe("running");
    expect(await entries()).toBe(before);
    await second.engine.close();

    // Admitted again (a later boot adopts the row's current admission version): the assertion runs first,
    // then the host's continuation.
    log.length = 0;
    const third = await booting();
    await third.engine.recoverInterrupted(1000, { continueNode: host });
    expect((await third.engine.finished(started.workflowId)).status).toBe("completed");
    expect(log).toEqual(["assert", "continue", "startFresh:TASK a"]);
  });

  it("the continuation's outcome and thrown values pass through unchanged (S004-359)", async () => {
    const w = await world(db.pool);
    const started = await interrupted(w);
    const thrown = Object.assign(new Error("the host could not continue"), { code: "host_refused" });
    const events: WorkflowEvent[] = [];
    const second = await w.engine(({ task }) => `done ${taskLine(task)}`, {
      onEvent: (e) => events.push(e),
    });
    all.push(second.engine);
    await second.engine.recoverInterrupted(1000, {
      continueNode: async () => {
        throw thrown;
      },
    });
    expect((await second.engine.finished(started.workflowId)).status).toBe("failed");
    const errors = events.filter((e) => e.type === "node_error");
    expect(errors).toHaveLength(1);
    expect(errors[0]?.type === "node_error" && errors[0].error).toBe(thrown);
    expect((await journal(started.workflowId)).nodes.a?.error).toEqual({
      code: "host_refused",
      message: "the host could not continue",
    });

    const w2 = await world(db.pool);
    const s2 = await interrupted(w2);
    const third = await w2.engine(({ task }) => `done ${taskLine(task)}`);
    all.push(third.engine);
    const result: NodeRunResult = { status: "answered", reply: "the host's own answer" };
    await third.engine.recoverInterrupted(1000, { continueNode: async () => result });
    const outcome = await third.engine.finished(s2.workflowId);
    expect(outcome.status).toBe("completed");
    expect(outcome.summary).toContain("the host's own answer");
  });
});

describe("host-proven recovery admission", () => {
  it("boot resume takes {workflowGeneration, recoveryAdmissionVersion} from the claimed native row: a journal claiming other numbers is overridden, and the protected continuation is admitted under the row's (S004-381)", async () => {
    const w = await world(db.pool);
    const started = await interrupted(w);
    await db.pool.query(
      "update workflows set generation = 3, recovery_admission_version = 2 where id = $1::uuid",
      [started.workflowId],
    );
    await db.pool.query(
      `update workflow_journals set body = jsonb_set(body, '{recovery}',
         '{"workflowGeneration": 9, "recoveryAdmissionVersion": 9}') where workflow_id = $1::uuid`,
      [started.workflowId],
    );
    expect((await journal(started.workflowId)).recovery).toEqual({
      workflowGeneration: 9,
      recoveryAdmissionVersion: 9,
    });
    const admitted: Array<{ generation: number; admission: number }> = [];
    const second = await w.engine(({ task }) => `done ${taskLine(task)}`);
    all.push(second.engine);
    await second.engine.recoverInterrupted(1000, {
      continueNode: async (input, host) => {
        const run = second.engine.run(started.workflowId);
        admitted.push({
          generation: run?.journal.recovery.workflowGeneration ?? -1,
          admission: run?.journal.recovery.recoveryAdmissionVersion ?? -1,
        });
        return second.dispatcher.continueNode(input, host);
      },
    });
    expect((await second.engine.finished(started.workflowId)).status).toBe("completed");
    expect(admitted).toEqual([{ generation: 3, admission: 2 }]);
    const row = await second.engine.store.getWorkflow(started.workflowId);
    expect(row?.recovery).toEqual({ workflowGeneration: 3, recoveryAdmissionVersion: 2 });
  });
});

/**
 * A daemon dies while node a's child is mid-turn (its task journaled, nothing answered); a second daemon
 * boots over it with the real SubagentSessionDispatch (forked scripted runners). a's task delegates a
 * grandchild; b is a fresh node. The same is then done twice more with a host hook that re-enters the
 * scope naming another channel, or another parent, for the same child. Every placement, every native-row
 * read made by an assertion (engine or placement), every node status and the charged dispatches are
 * recorded.
 */
describe("the scope at the real placement (SubagentSessionDispatch with forked runners)", () => {
  interface Booted {
    childA: string;
    childB: string;
    grandchild: string;
    asserted: string[];
    statuses: string[];
    charged: number;
    dispatches: number;
    recovery: unknown;
    outcome: Awaited<ReturnType<WorkflowEngine["finished"]>>;
  }
  const placements: Array<{ sessionId: string; placement: string }> = [];
  let dispatched = false;
  let exact: Booted;
  let otherChannel: Booted;
  let otherParent: Booted;

  beforeAll(async () => {
    const repo = new PgDelegationRepository(db.pool);
    const pool = new SubagentRunnerPool({
      sizing: () => ({ maxRunners: 1, turnsPerRunner: 4 }),
      retryPolicySource: () =>
        new MemoryRetryPolicySource({ revision: 1, maxRetries: 1, initialDelayMs: 100, multiplier: 2 }),
      catalog: () => ({ revision: 1, public: [{ id: "scripted", provider: "scripted" }], accounts: {} }),
    });
    const dispatch = new SubagentSessionDispatch({
      pool,
      inProcess: createScriptedTurnRunner(),
      runnerEnabled: () => true,
      runnerKind: "scripted",
      onPlaced: (request, placement) => placements.push({ sessionId: request.sessionId, placement }),
      // As the daemon does: a child's channel is its parent session.
      placementOf: async (request) => {
        const row = await repo.getSession(request.sessionId, request.principalAccountId);
        return row.parentSessionId
          ? { channelId: row.parentSessionId, parentSessionId: row.parentSessionId }
          : { channelId: row.id };
      },
    });
    const service = new DelegationService({
      repo,
      runner: dispatch,
      spill: new FileSpillStore(scratchDir("crw-spill-")),
    });
    await service.start();
    const base = new JournalNodeDispatcher(repo, delegationNodeTurns(service));
    const boot = async (hook?: RecoveryContinueNode): Promise<Booted> => {
      const account = await repo.createAccount({ name: `a-${randomUUID()}`, isOwner: true });
      const parent = await repo.createRootSession(account.id, "scripted");
      const grandchildTask = scriptTask({ answer: "grandchild reports" });
      const nodeTask = scriptTask({
        rounds: [[{ name: "Delegate", arguments: { task: grandchildTask, background: false } }]],
        answer: "node a done",
      });
      const def = parseWorkflowDefinition(
        JSON.stringify({
          name: "placed",
          nodes: [
            { id: "a", task: nodeTask },
            { id: "b", task: "TASK b", dependsOn: ["a"] },
          ],
        }),
        "json",
      );
      const ctx = {
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: "call-1",
        currentAccess: async () => service.authorityFor(parent),
        currentWorkDir: async () => null,
        ...hostAccessors(),
      };
      const engineOptions = {
        pool: db.pool,
        defaultModel: "scripted",
        repo,
        onCompletion: (c: { parentSessionId: string; principalAccountId: string; resultId: string }) =>
          service.resultQueued(c.parentSessionId, c.principalAccountId, c.resultId),
      };
      const first = new WorkflowEngine({
        ...engineOptions,
        owner: `wf-${randomUUID()}`,
        dispatcher: {
          createChild: (r) => base.createChild(r),
          runNode: async (r) => {
            await repo.append(r.childSessionId, r.principalAccountId, [
              { body: { type: "message", message: { role: "user", content: r.prompt } } },
            ]);
            return untilAborted(r.signal);
          },
          continueNode: (i, h) => base.continueNode(i, h),
        },
      });
      await first.open();
      const started = await first.start(ctx, { definition: def });
      await until(() => first.run(started.workflowId)?.started.has("a") === true, "a running");
      await first.close();
      const childA = (await journal(started.workflowId)).nodes.a?.childSessionId as string;
      const charged = (await journal(started.workflowId)).dispatches;
      const statuses: string[] = [];
      let dispatches = 0;
      const second: WorkflowEngine = new WorkflowEngine({
        ...engineOptions,
        owner: `wf-${randomUUID()}`,
        dispatcher: {
          createChild: (r) => base.createChild(r),
          runNode: (r) => base.runNode(r),
          continueNode: (i, h) => {
            dispatched = true;
            return base.continueNode(i, h);
          },
        },
        onEvent: (e) => {
          if (e.type !== "node" || e.workflowId !== started.workflowId) return;
          statuses.push(`${e.nodeId}:${e.status}`);
          dispatches = Math.max(dispatches, second.run(started.workflowId)?.journal.dispatches ?? 0);
        },
      });
      // Every native-row read is an assertion (the engine reads the row for nothing else): one made before
      // the continuation reached the dispatcher is the engine's, one made after it is the placement's.
      const asserted: string[] = [];
      dispatched = false;
      const read = second.store.currentWorkflow.bind(second.store);
      second.store.currentWorkflow = async (id) => {
        asserted.push(dispatched ? "placement" : "engine");
        return read(id);
      };
      try {
        await second.open();
        await second.recoverInterrupted(1000, hook ? { continueNode: hook } : {});
        const outcome = await second.finished(started.workflowId);
        const childB = (
          await db.pool.query(
            "select id from sessions where parent_session_id = $1::uuid and id <> $2::uuid",
            [parent.id, childA],
          )
        ).rows[0]?.id as string;
        const { rows } = await db.pool.query("select id from sessions where parent_session_id = $1::uuid", [
          childA,
        ]);
        return {
          childA,
          childB,
          grandchild: String(rows[0]?.id),
          asserted,
          statuses,
          charged,
          dispatches,
          recovery: (await second.store.getWorkflow(started.workflowId))?.recovery,
          outcome,
        };
      } finally {
        await second.close();
      }
    };
    const reentered =
      (change: (s: HostWorkflowNodeDispatch) => Partial<HostWorkflowNodeDispatch>): RecoveryContinueNode =>
      (input, host) => {
        const scope = currentWorkflowNodeDispatch() as HostWorkflowNodeDispatch;
        dispatched = true;
        return runWithWorkflowNodeDispatch({ ...scope, ...change(scope) }, () =>
          base.continueNode(input, host),
        );
      };
    try {
      exact = await boot();
      otherChannel = await boot(reentered(() => ({ channelId: randomUUID() })));
      otherParent = await boot(reentered(() => ({ parentSessionId: randomUUID() })));
    } finally {
      await service.close();
      await pool.close();
    }
  }, 120_000);

  const placed = (sessionId: string) =>
    placements.filter((p) => p.sessionId === sessionId).map((p) => p.placement);

  it("the recovered child runs in the daemon only when both the scope's parent and its channel are the child's (S004-362)", () => {
    expect(placed(exact.childA)).toEqual(["in-process"]);
    // The same exact child under a scope naming another channel, or another parent: its runner placement.
    expect(placed(otherChannel.childA)).toEqual(["runner"]);
    expect(placed(otherParent.childA)).toEqual(["runner"]);
    expect([exact, otherChannel, otherParent].map((b) => b.outcome.status)).toEqual([
      "completed",
      "completed",
      "completed",
    ]);
  });

  it("only the exact match runs the placement's assertion; a call that does not match runs none (S004-364)", () => {
    // The engine's assertion ran once before preparation; the placement's once, for the exact match only.
    expect(exact.asserted).toEqual(["engine", "placement"]);
    expect(otherChannel.asserted).toEqual(["engine"]);
    expect(otherParent.asserted).toEqual(["engine"]);
  });

  it("the placement's check is the engine's own native-row read, reached through the scope's callback (S004-366)", () => {
    // The read at the placement went through assertProtectedDispatch into the engine's assertDispatch:
    // the placement layer queries nothing of its own.
    expect(exact.asserted.filter((a) => a === "placement")).toHaveLength(1);
    expect(exact.outcome.summary).toContain("node a done");
  });

  it("the placement neither admits nor charges: only b's fresh dispatch is charged, the admission is unchanged (S004-367)", () => {
    expect(exact.dispatches).toBe(exact.charged + 1);
    expect(exact.recovery).toEqual({ workflowGeneration: 1, recoveryAdmissionVersion: 1 });
  });

  it("only the boot's recovery of the exact child is placed in the daemon: its nested child and the fresh node keep the runner (S004-355)", () => {
    expect(placed(exact.childA)).toEqual(["in-process"]);
    expect(placed(exact.grandchild)).toEqual(["runner"]);
    expect(placed(exact.childB)).toEqual(["runner"]);
    expect(placed(otherChannel.childB)).toEqual(["runner"]);
  });
});

describe("a scope without its assertion at the real placement", () => {
  it("a continuation that re-enters the scope without its assertion fails loudly at the placement; nothing runs (S004-364)", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const inProcess = createScriptedTurnRunner();
    let turns = 0;
    const dispatch = new SubagentSessionDispatch({
      inProcess: {
        runTurn: (r, h) => {
          turns++;
          return inProcess.runTurn(r, h);
        },
      },
      runnerEnabled: () => false,
      placementOf: async (request) => {
        const row = await repo.getSession(request.sessionId, request.principalAccountId);
        return { channelId: row.parentSessionId ?? row.id, parentSessionId: row.parentSessionId ?? row.id };
      },
    });
    const service = new DelegationService({
      repo,
      runner: dispatch,
      spill: new FileSpillStore(scratchDir("crw-spill-")),
    });
    await service.start();
    const w = await world(db.pool);
    const started = await interrupted(w);
    turns = 0;
    const base = new JournalNodeDispatcher(w.repo, delegationNodeTurns(service));
    const second = await w.engine(() => "unused", { dispatcher: base });
    all.push(second.engine);
    // A host hook that strips the assertion and re-enters the scope for the same exact child.
    const forged: RecoveryContinueNode = (input, host) => {
      const { assertDispatch: _dropped, ...rest } = currentWorkflowNodeDispatch() as HostWorkflowNodeDispatch;
      return runWithWorkflowNodeDispatch(rest, () => base.continueNode(input, host));
    };
    await second.engine.recoverInterrupted(1000, { continueNode: forged });
    expect((await second.engine.finished(started.workflowId)).status).toBe("failed");
    expect((await journal(started.workflowId)).nodes.a?.error?.message).toMatch(/no assertion callback/);
    expect(turns).toBe(0);
    await service.close();
  });
});
