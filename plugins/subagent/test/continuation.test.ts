import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { afterEach, describe, expect, it } from "vitest";
import {
  JournalNodeDispatcher,
  type NodeContinueRequest,
  type NodeDispatcher,
  type NodeRecoveryHost,
  PgWorkflowStore,
  parseWorkflowDefinition,
  type RecoveryContinueNode,
  readOrchestrationJournal,
  SessionWorkAbortedError,
  scriptedNodeTurnRunner,
  type WorkflowEngine,
  type WorkflowEvent,
} from "../src/index.js";
import { deferred, storeWholeJournal, taskLine, until, untilAborted, type World, world } from "./helpers.js";

const db = useTestDatabase();
const all: WorkflowEngine[] = [];
afterEach(async () => {
  for (const e of all.splice(0)) await e.close();
});

async function journal(workflowId: string) {
  const r = readOrchestrationJournal(await new PgWorkflowStore(db.pool).readJournal(workflowId));
  if (!r.ok) throw new Error(r.reason);
  return r.journal;
}

async function childMessages(
  childId: string,
): Promise<Array<{ role: string; content: unknown; customType?: string }>> {
  const { rows } = await db.pool.query(
    "select body from journal_entries where session_id = $1::uuid order by seq",
    [childId],
  );
  return rows.map((r) => JSON.parse(r.body).message);
}

const waits = parseWorkflowDefinition(`
name: waits
nodes:
  - { id: remote, task: "TASK remote" }
  - { id: after, task: "TASK after", dependsOn: [remote] }
`);

/**
 * A workflow whose node `remote` parks at a controlled boundary: its dispatch returns `waiting` with a
 * committed prerequisite (the child exists, nothing ran). Everything else is the real dispatcher.
 */
async function parked(
  w: World,
  options: {
    turns?: string[];
    continueCalls?: Array<{ input: NodeContinueRequest; host?: NodeRecoveryHost }>;
    /** The engine's repository (a test may gate a read on it). */
    repo?: World["repo"];
    /** The starting call's context overrides (its access). */
    ctx?: Parameters<World["ctx"]>[0];
    waitId?: string;
    claimVersion?: number;
  } = {},
) {
  const turns = options.turns ?? [];
  const waitId = options.waitId ?? "wait-1";
  const claimVersion = options.claimVersion ?? 3;
  const { engine, events, dispatcher } = await w.engine(
    ({ task }) => {
      turns.push(taskLine(task));
      return `done ${taskLine(task)}`;
    },
    {
      ...(options.repo ? { repo: options.repo } : {}),
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        runNode: async (r) =>
          r.nodeId === "remote"
            ? { status: "waiting", prerequisite: { waitId, claimVersion } }
            : base.runNode(r),
        continueNode: (input, host) => {
          options.continueCalls?.push({ input, ...(host ? { host } : {}) });
          return base.continueNode(input, host);
        },
      }),
    },
  );
  all.push(engine);
  const ctx = w.ctx(options.ctx);
  const started = await engine.start(ctx, { definition: waits });
  await until(
    async () =>
      (await journal(started.workflowId)).nodes.remote?.status === "waiting" &&
      engine.run(started.workflowId)?.active.has("remote") === false,
    "remote waiting (its park settled)",
  );
  const wake = {
    workflowId: started.workflowId,
    parentSessionId: w.parentSessionId,
    toolCallId: ctx.toolCallId,
    workflowGeneration: 1,
    recoveryAdmissionVersion: 1,
    nodeId: "remote",
    waitId,
    claimVersion,
  };
  return { engine, events, dispatcher, started, wake, turns };
}

describe("the engine's node cap", () => {
  it("S004-189: the plugin's cap on executing nodes applies across workflows, on top of any runner queue", async () => {
    const w = await world(db.pool);
    let inFlight = 0;
    let peak = 0;
    const gates: Array<() => void> = [];
    const { engine } = await w.engine(
      async ({ task }) => {
        inFlight++;
        peak = Math.max(peak, inFlight);
        await new Promise<void>((r) => gates.push(r));
        inFlight--;
        return `done ${taskLine(task)}`;
      },
      { maxActiveNodes: 2 },
    );
    all.push(engine);
    const wide = parseWorkflowDefinition(`
name: wide
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b" }
  - { id: c, task: "TASK c" }
`);
    const one = await engine.start(w.ctx(), { definition: wide });
    const two = await engine.start(w.ctx(), { definition: wide });
    await until(() => gates.length === 2, "two turns in flight");
    // Ready nodes beyond the cap stay pending (never reserved, never charged) until a slot frees.
    await new Promise((r) => setTimeout(r, 100));
    expect(gates.length).toBe(2);
    expect(engine.activeNodes()).toBe(2);
    const pending = [
      ...Object.values((await journal(one.workflowId)).nodes),
      ...Object.values((await journal(two.workflowId)).nodes),
    ].filter((n) => n.status === "pending").length;
    expect(pending).toBe(4);
    let finished = false;
    const both = Promise.all([engine.finished(one.workflowId), engine.finished(two.workflowId)]).finally(
      () => {
        finished = true;
      },
    );
    while (!finished) {
      gates.shift()?.();
      await new Promise((r) => setTimeout(r, 5));
    }
    expect((await both).map((o) => o.status)).toEqual(["completed", "completed"]);
    expect(peak).toBe(2);
    await expect(w.engine(() => "x", { maxActiveNodes: 0 })).rejects.toThrow(/maxActiveNodes/);
  });
});

describe("canonical continuation", () => {
  it("S004-343: S004-344: S004-383: S004-335: S004-339: S004-338: S004-332: S004-337: one input object in, one outcome out: answered, continued, empty; a retry never reuses the failed attempt", async () => {
    const w = await world(db.pool);
    const scopes: string[] = [];
    const dispatcher = new JournalNodeDispatcher(w.repo, {
      async executeTurn(child, _signal, onEvent) {
        scopes.push(child.scope);
        const last = (await childMessages(child.sessionId)).filter((m) => m.role === "user").at(-1);
        onEvent?.({ type: "text", text: "working" });
        const reply = `reply to ${String(last?.content)}`;
        await w.repo.append(child.sessionId, child.principalAccountId, [
          {
            body: {
              type: "message",
              message: {
                role: "assistant",
                content: [{ type: "text", text: reply }],
                stopReason: "stop",
                model: "m",
              },
            },
          },
        ]);
        return { stopReason: "stop", reply };
      },
    });
    const scope = JSON.stringify({ stored: "scope" });
    const child = await dispatcher.createChild({
      workflowId: "wf",
      nodeId: "n",
      parentSessionId: w.parentSessionId,
      principalAccountId: w.accountId,
      model: "m",
      scope: "{}",
    });
    const input = (extra: Partial<NodeContinueRequest> = {}): NodeContinueRequest => ({
      workflowId: "wf",
      nodeId: "n",
      childSessionId: child,
      parentSessionId: w.parentSessionId,
      principalAccountId: w.accountId,
      model: "m",
      scope,
      signal: new AbortController().signal,
      ...extra,
    });
    // There is no positional (child, text) form.
    await expect(
      (dispatcher.continueNode as unknown as (a: string, b: string) => Promise<unknown>)(child, "text"),
    ).rejects.toThrow(TypeError);
    // An empty transcript and no task: empty, and nothing ran.
    expect(await dispatcher.continueNode(input())).toEqual({ status: "empty" });
    expect(await childMessages(child)).toEqual([]);
    // With the task (data only): continued, with the event stream and the stored scope.
    const seen: string[] = [];
    expect(
      await dispatcher.continueNode(input({ task: "first", onEvent: (e) => seen.push(e.type) })),
    ).toEqual({
      status: "continued",
      reply: "reply to first",
    });
    expect(seen).toEqual(["text"]);
    expect(scopes).toEqual([scope]);
    // A settled answer written by another process is read from the journal: reused, nothing runs.
    await w.repo.append(child, w.accountId, [
      { body: { type: "message", message: { role: "user", content: "second" } } },
      {
        body: {
          type: "message",
          message: {
            role: "assistant",
            content: [{ type: "text", text: "settled elsewhere" }],
            stopReason: "stop",
            model: "m",
          },
        },
      },
    ]);
    expect(await dispatcher.continueNode(input())).toEqual({
      status: "answered",
      reply: "settled elsewhere",
    });
    expect(scopes.length).toBe(1);
    // An explicit retry in the same child: the task is appended directly and a new turn answers it.
    expect(await dispatcher.continueNode(input({ fallbackPrompt: "retry task" }))).toEqual({
      status: "continued",
      reply: "reply to retry task",
    });
    expect(scopes).toEqual([scope, scope]);
    const messages = await childMessages(child);
    expect(messages.at(-2)).toEqual({ role: "user", content: "retry task" });
  });

  it("S004-336: an interrupted retry continues with verify-before-repeat, never a second retry task", async () => {
    const w = await world(db.pool);
    const gate = deferred();
    let turns = 0;
    const dispatcher = new JournalNodeDispatcher(
      w.repo,
      scriptedNodeTurnRunner(async ({ signal }) => {
        turns++;
        if (turns === 1) {
          gate.resolve();
          return untilAborted(signal);
        }
        return "finished after verifying";
      }),
    );
    const child = await dispatcher.createChild({
      workflowId: "wf",
      nodeId: "n",
      parentSessionId: w.parentSessionId,
      principalAccountId: w.accountId,
      model: "m",
      scope: "{}",
    });
    await w.repo.append(child, w.accountId, [
      { body: { type: "message", message: { role: "user", content: "original" } } },
    ]);
    const controller = new AbortController();
    const base = {
      workflowId: "wf",
      nodeId: "n",
      childSessionId: child,
      parentSessionId: w.parentSessionId,
      principalAccountId: w.accountId,
      model: "m",
      scope: "{}",
    };
    const retry = dispatcher.continueNode({
      ...base,
      fallbackPrompt: "retry task",
      signal: controller.signal,
    });
    await gate.promise;
    controller.abort();
    expect(await retry).toEqual({ status: "aborted" });
    const again = await dispatcher.continueNode({ ...base, signal: new AbortController().signal });
    expect(again).toEqual({ status: "continued", reply: "finished after verifying" });
    const messages = await childMessages(child);
    expect(messages.filter((m) => m.content === "retry task")).toHaveLength(1);
    expect(messages.map((m) => m.customType ?? m.role)).toEqual(["user", "user", "interrupted", "assistant"]);
  });

  it("S004-328: S004-363: a child is continued only when it is durably a delegated child of the workflow's parent; no identity is no wildcard", async () => {
    const w = await world(db.pool);
    let turns = 0;
    const dispatcher = new JournalNodeDispatcher(
      w.repo,
      scriptedNodeTurnRunner(() => {
        turns++;
        return "ran";
      }),
    );
    const otherParent = await w.repo.createRootSession(w.accountId, "scripted");
    const foreign = await dispatcher.createChild({
      workflowId: "wf",
      nodeId: "n",
      parentSessionId: otherParent.id,
      principalAccountId: w.accountId,
      model: "m",
      scope: "{}",
    });
    const base = {
      workflowId: "wf",
      nodeId: "n",
      parentSessionId: w.parentSessionId,
      principalAccountId: w.accountId,
      model: "m",
      scope: "{}",
      task: "do it",
      signal: new AbortController().signal,
    };
    for (const childSessionId of [foreign, "", w.parentSessionId, randomUUID()]) {
      await expect(dispatcher.continueNode({ ...base, childSessionId })).rejects.toMatchObject({
        name: "WorkflowStateError",
        code: "child_mismatch",
      });
    }
    expect(turns).toBe(0);
    expect(await childMessages(foreign)).toEqual([]);
    // Through the engine: a journal pointing a node at another parent's child fails that node, running nothing.
    const chain = parseWorkflowDefinition(`
name: chain
nodes:
  - { id: a, task: "TASK a" }
`);
    const first = await w.engine(({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: chain });
    await until(() => first.engine.run(started.workflowId)?.started.has("a") === true, "a running");
    await first.engine.close();
    const j = await journal(started.workflowId);
    (j.nodes.a as { childSessionId: string }).childSessionId = foreign;
    await storeWholeJournal(db.pool, started.workflowId, j);
    let ran = 0;
    const second = await w.engine(() => {
      ran++;
      return "never";
    });
    all.push(second.engine);
    await second.engine.recoverInterrupted();
    const outcome = await second.engine.finished(started.workflowId);
    expect(outcome.status).toBe("failed");
    expect(outcome.summary).toContain("not a child of the workflow's parent");
    expect(ran).toBe(0);
    expect(await childMessages(foreign)).toEqual([]);
  });
});

describe("recovery hooks", () => {
  it("S004-345: S004-346: S004-424: S004-395: S004-386: S004-382: S004-354: S004-429: startFresh reaches only the daemon-local continueNode (boot and wake), as a host argument of one hook type", async () => {
    const w = await world(db.pool);
    const calls: Array<{ input: NodeContinueRequest; host?: NodeRecoveryHost }> = [];
    const { engine, events, started, wake } = await parked(w, { continueCalls: calls });
    const hostCalls: Array<{ input: NodeContinueRequest; host?: NodeRecoveryHost }> = [];
    const base = new JournalNodeDispatcher(
      w.repo,
      scriptedNodeTurnRunner(({ task }) => `hooked ${taskLine(task)}`),
    );
    // The host's own continueNode: the same type boot recovery's hook takes.
    const hostContinue: RecoveryContinueNode = (input, host) => {
      hostCalls.push({ input, ...(host ? { host } : {}) });
      return base.continueNode(input, host);
    };
    const held = await journal(started.workflowId);
    expect(engine.resumeWaitingNode({ ...wake, continueNode: hostContinue })).toEqual({ status: "accepted" });
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("completed");
    expect(calls).toEqual([]); // the engine's dispatcher was not used for the wake
    expect(hostCalls).toHaveLength(1);
    const call = hostCalls[0] as { input: NodeContinueRequest; host?: NodeRecoveryHost };
    // The input is one data object (plus the event stream): no startFresh, no predicate, no task callback.
    expect(Object.keys(call.input).sort()).toEqual([
      "childSessionId",
      "model",
      "nodeId",
      "onEvent",
      "parentSessionId",
      "principalAccountId",
      "scope",
      "signal",
      "workflowId",
    ]);
    expect(Object.values(call.input).filter((v) => typeof v === "function")).toHaveLength(1);
    expect(call.input.scope).toBe(held.nodeAccess.remote);
    expect(call.input.childSessionId).toBe(held.nodes.remote?.childSessionId);
    expect(typeof call.host?.startFresh).toBe("function");
    // The planned child had an empty transcript: startFresh built the original task with its handovers.
    const child = call.input.childSessionId;
    expect((await childMessages(child))[0]).toEqual({ role: "user", content: "TASK remote" });
    expect(events.some((e) => e.type === "node_progress" && e.nodeId === "remote")).toBe(true);
  });

  it("S004-345: S004-354: S004-429: S004-428: explicit WorkflowResume (the live caller) retries with a data-only fallbackPrompt, never startFresh or a connection predicate", async () => {
    const w = await world(db.pool);
    const calls: Array<{ input: NodeContinueRequest; host?: NodeRecoveryHost }> = [];
    const runs: Array<Record<string, unknown>> = [];
    let fail = true;
    const { engine } = await w.engine(
      ({ task }) => {
        if (fail) throw new Error("provider down");
        return `done ${taskLine(task)}`;
      },
      {
        wrap: (base): NodeDispatcher => ({
          createChild: (r) => base.createChild(r),
          runNode: (r) => {
            runs.push({ ...r });
            return base.runNode(r);
          },
          continueNode: (input, host) => {
            calls.push({ input, ...(host ? { host } : {}) });
            return base.continueNode(input, host);
          },
        }),
      },
    );
    all.push(engine);
    const one = parseWorkflowDefinition(`
name: one
nodes:
  - { id: a, task: "TASK a" }
`);
    const ctx = w.ctx();
    const started = await engine.start(ctx, { definition: one });
    expect((await engine.finished(started.workflowId)).status).toBe("failed");
    fail = false;
    await engine.resume(w.ctx({ toolCallId: `call-${randomUUID()}` }), started.workflowId);
    expect((await engine.finished(started.workflowId)).status).toBe("completed");
    expect(calls).toHaveLength(1);
    const call = calls[0] as { input: NodeContinueRequest; host?: NodeRecoveryHost };
    expect(call.input.fallbackPrompt).toBe("TASK a");
    expect(call.host?.startFresh).toBeUndefined();
    expect(call.host?.isCurrentConnection).toBeUndefined();
    expect(Object.values(call.input).filter((v) => typeof v === "function")).toHaveLength(1); // onEvent
    expect("startFresh" in call.input).toBe(false);
    // The node dispatch request (what a runner receives) has no fresh callback either.
    expect(runs.every((r) => !("startFresh" in r))).toBe(true);
  });

  it("S004-348: S004-425: an empty continuation refuses: the node fails, no fresh dispatch bypasses the owner, no completion is inferred", async () => {
    const w = await world(db.pool);
    let fresh = 0;
    const { engine, events } = await w.engine(() => "never", {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        runNode: async (r) => {
          if (r.nodeId === "remote")
            return { status: "waiting", prerequisite: { waitId: "w", claimVersion: 1 } };
          fresh++;
          return base.runNode(r);
        },
        continueNode: async () => ({ status: "empty" }),
      }),
    });
    all.push(engine);
    const ctx = w.ctx();
    const started = await engine.start(ctx, { definition: waits });
    await until(
      async () =>
        (await journal(started.workflowId)).nodes.remote?.status === "waiting" &&
        engine.run(started.workflowId)?.active.has("remote") === false,
      "waiting",
    );
    const children = async () =>
      (
        await db.pool.query("select count(*)::int n from sessions where parent_session_id = $1::uuid", [
          w.parentSessionId,
        ])
      ).rows[0].n;
    const before = await children();
    expect(
      engine.resumeWaitingNode({
        workflowId: started.workflowId,
        parentSessionId: w.parentSessionId,
        toolCallId: ctx.toolCallId,
        workflowGeneration: 1,
        recoveryAdmissionVersion: 1,
        nodeId: "remote",
        waitId: "w",
        claimVersion: 1,
      }),
    ).toEqual({ status: "accepted" });
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("failed");
    const j = await journal(started.workflowId);
    expect(j.nodes.remote?.status).toBe("failed");
    expect(j.nodes.remote?.error?.code).toBe("empty_continuation");
    expect(j.nodes.remote?.waiting).toBeUndefined();
    expect(j.nodes.after?.status).toBe("blocked");
    expect(fresh).toBe(0);
    expect(await children()).toBe(before);
    expect(
      events
        .filter((e) => e.type === "node" && e.nodeId === "remote")
        .map((e) => (e as { status: string }).status),
    ).not.toContain("succeeded");
  });
});

describe("waiting after a wake", () => {
  it("S004-399: S004-383: a continuation that parks again carries its actual committed prerequisite; acceptance proves nothing", async () => {
    const w = await world(db.pool);
    const { engine, events, started, wake } = await parked(w);
    const repark: RecoveryContinueNode = async () => ({
      status: "waiting",
      prerequisite: { waitId: "wait-2", claimVersion: 9 },
    });
    expect(engine.resumeWaitingNode({ ...wake, continueNode: repark })).toEqual({ status: "accepted" });
    await until(
      async () =>
        (await journal(started.workflowId)).nodes.remote?.waiting?.waitId === "wait-2" &&
        engine.run(started.workflowId)?.active.has("remote") === false,
      "reparked",
    );
    const j = await journal(started.workflowId);
    expect(j.nodes.remote?.status).toBe("waiting");
    expect(j.nodes.remote?.waiting).toEqual({ waitId: "wait-2", claimVersion: 9 });
    expect(j.nodes.after?.status).toBe("pending");
    expect(events.some((e) => e.type === "workflow")).toBe(false);
    // The old claim no longer wakes it; the committed one does (a newer admission version is adopted).
    expect(engine.resumeWaitingNode(wake)).toEqual({ status: "stale" });
    expect(
      engine.resumeWaitingNode({ ...wake, waitId: "wait-2", claimVersion: 9, recoveryAdmissionVersion: 2 }),
    ).toEqual({ status: "accepted" });
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("completed");
    // No generation was invented by the wake or the repark.
    expect((await engine.store.getWorkflow(started.workflowId))?.recovery.workflowGeneration).toBe(1);
  });
});

describe("a wake's live connection", () => {
  it("S004-368: S004-369: S004-396: S004-397: S004-398: S004-439: the connection is rechecked after every awaited step up to the dispatch; false aborts and the node keeps waiting", async () => {
    const w = await world(db.pool);
    const turns: string[] = [];
    const { engine, events, started, wake } = await parked(w, { turns });
    // The claim matches, but the predicate answers false at the k-th check: nothing is dispatched.
    let checksWhenOpen = 0;
    for (let k = 0; ; k++) {
      let n = 0;
      const errorsBefore = events.filter((e) => e.type === "node_error").length;
      expect(engine.resumeWaitingNode({ ...wake, isCurrentConnection: () => n++ < k })).toEqual({
        status: "accepted",
      });
      await until(async () => !engine.run(started.workflowId)?.active.has("remote"), "the wake settled");
      const j = await journal(started.workflowId);
      if (j.nodes.remote?.status !== "waiting") {
        // k checks all answered true: the node ran.
        checksWhenOpen = n;
        break;
      }
      expect(turns).toEqual([]);
      expect(j.nodes.remote?.waiting).toEqual({ waitId: "wait-1", claimVersion: 3 });
      const error = events.filter((e) => e.type === "node_error").slice(errorsBefore)[0] as
        | Extract<WorkflowEvent, { type: "node_error" }>
        | undefined;
      expect(error?.error).toBeInstanceOf(SessionWorkAbortedError);
      expect(k).toBeLessThan(20);
    }
    // Engine (accepted, authorized, journaled, dispatch) and dispatcher (parent, transcript, task, journaled, dispatch).
    expect(checksWhenOpen).toBeGreaterThanOrEqual(8);
    // `after` depends on `remote` and starts as soon as `remote` completes: only the finished workflow's
    // turns are a fixed list (remote ran once, after the refused wakes dispatched nothing; then after).
    expect((await engine.finished(started.workflowId)).status).toBe("completed");
    expect(turns).toEqual(["TASK remote", "TASK after"]);
  });

  it("S004-385: S004-323: admission is rechecked after the wake's async authorization, and the journal's scope is only compared with current access", async () => {
    const w = await world(db.pool);
    const gate = deferred();
    const entered = deferred();
    let gated = false;
    const repo = Object.create(w.repo) as typeof w.repo;
    repo.getAccount = async (id: string) => {
      if (gated) {
        entered.resolve();
        await gate.promise;
      }
      return w.repo.getAccount(id);
    };
    const turns: string[] = [];
    const calls: Array<{ input: NodeContinueRequest; host?: NodeRecoveryHost }> = [];
    // A parked workflow on an engine whose authorization reads the (gated) account.
    const { engine, started, wake } = await parked(w, { turns, continueCalls: calls, repo });
    const dispatches = (await journal(started.workflowId)).dispatches;
    gated = true;
    expect(engine.resumeWaitingNode(wake)).toEqual({ status: "accepted" });
    await entered.promise;
    // A Stop while the authorization is in flight: once it returns, nothing is dispatched or charged.
    const cancelled = engine.cancel(started.workflowId, w.accountId);
    gate.resolve();
    const outcome = await cancelled;
    expect(outcome.status).toBe("cancelled");
    expect(calls).toEqual([]);
    expect(turns).toEqual([]);
    expect((await journal(started.workflowId)).dispatches).toBe(dispatches);
    expect(outcome.summary).toContain("remote: interrupted");

    // A journaled node scope that the account no longer covers: the wake refuses, never widening access.
    gated = false;
    const second = await parked(w, {
      continueCalls: calls,
      ctx: { access: { tools: { allow: ["Read", "Bash"] } } },
      waitId: "wait-2",
      claimVersion: 1,
    });
    await db.pool.query("update accounts set tool_allow = '{Read}' where id = $1::uuid", [w.accountId]);
    expect(second.engine.resumeWaitingNode(second.wake)).toEqual({ status: "accepted" });
    const refused = await second.engine.finished(second.started.workflowId);
    expect(refused.status).toBe("failed");
    const j = await journal(second.started.workflowId);
    expect(j.nodes.remote?.error?.code).toBe("resume_refused");
    expect(j.nodes.remote?.error?.message).toMatch(/allow-list entry is not fully covered/);
    expect(calls).toEqual([]);
  });
});

describe("boot recovery declarations", () => {
  it("S004-394: S004-403: boot adopts the native generation as recorded (never from the run number) and never calls the explicit-resume bridge", async () => {
    const w = await world(db.pool);
    const chain = parseWorkflowDefinition(`
name: chain
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);
    const first = await w.engine(({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: chain });
    await until(() => first.engine.run(started.workflowId)?.started.has("a") === true, "a running");
    await first.engine.close();
    // The native record moved on (as the host recorded it); the journal's run number says nothing about it.
    await db.pool.query(
      "update workflows set generation = 7, recovery_admission_version = 4 where id = $1::uuid",
      [started.workflowId],
    );
    const before = await journal(started.workflowId);
    expect(before.run).toBe(1);
    const second = await w.engine(({ task }) => `done ${taskLine(task)}`);
    all.push(second.engine);
    let bridged = 0;
    const advance = second.engine.store.advanceWorkflowGeneration.bind(second.engine.store);
    second.engine.store.advanceWorkflowGeneration = async (input) => {
      bridged++;
      return advance(input);
    };
    await second.engine.recoverInterrupted();
    const outcome = await second.engine.finished(started.workflowId);
    expect(outcome.status).toBe("completed");
    expect(bridged).toBe(0);
    const row = await second.engine.store.getWorkflow(started.workflowId);
    expect(row?.recovery).toEqual({ workflowGeneration: 7, recoveryAdmissionVersion: 4 });
  });

  it("S004-401: opening an engine over interrupted workflows starts no turn, timer or write by itself", async () => {
    const w = await world(db.pool);
    const one = parseWorkflowDefinition(`
name: one
nodes:
  - { id: a, task: "TASK a" }
`);
    const first = await w.engine(({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: one });
    await until(() => first.engine.run(started.workflowId)?.started.has("a") === true, "a running");
    await first.engine.close();
    const snapshot = async () =>
      (
        await db.pool.query(
          `select w.status, w.generation, w.locked_by, w.locked_at, w.updated_at, w.published_count, j.body::text as body,
                  j.revision, (select jsonb_agg(n order by n.node_id)::text from workflow_journal_nodes n
                                where n.workflow_id = w.id) as nodes
             from workflows w join workflow_journals j on j.workflow_id = w.id where w.id = $1::uuid`,
          [started.workflowId],
        )
      ).rows[0];
    const before = await snapshot();
    const timersBefore = process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;
    let turns = 0;
    const second = await w.engine(() => {
      turns++;
      return "x";
    });
    all.push(second.engine);
    await new Promise((r) => setTimeout(r, 150));
    expect(turns).toBe(0);
    expect(second.engine.runIds()).toEqual([]);
    expect(await snapshot()).toEqual(before);
    expect(process.getActiveResourcesInfo().filter((r) => r === "Timeout").length).toBeLessThanOrEqual(
      timersBefore,
    );
  });
});

describe("preparation failures and narrowing", () => {
  it("S004-371: a typed preparation failure reaches the node unchanged (same error as cause, same code), with no fallback or reattempt", async () => {
    const w = await world(db.pool);
    class TargetOfflineError extends Error {
      override readonly name = "TargetOfflineError";
      readonly code = "LOCAL_TARGET_OFFLINE";
    }
    const offline = new TargetOfflineError("the target computer is offline");
    let lookups = 0;
    let created = 0;
    let turns = 0;
    const { engine, events } = await w.engine(
      () => {
        turns++;
        return "never";
      },
      {
        workDirPolicy: async () => ({
          kind: "admin",
          canExecuteHost: true,
          projectForPath: async () => {
            lookups++;
            throw offline;
          },
        }),
        wrap: (base): NodeDispatcher => ({
          createChild: (r) => {
            created++;
            return base.createChild(r);
          },
          runNode: (r) => base.runNode(r),
          continueNode: (r, h) => base.continueNode(r, h),
        }),
      },
    );
    all.push(engine);
    const placed = parseWorkflowDefinition(`
name: placed
nodes:
  - { id: a, task: "TASK a", cwd: /tmp }
`);
    const started = await engine.start(w.ctx(), { definition: placed });
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("failed");
    const error = events.find((e) => e.type === "node_error") as Extract<
      WorkflowEvent,
      { type: "node_error" }
    >;
    expect(error.error.cause).toBe(offline);
    expect((error.error as { code?: string }).code).toBe("LOCAL_TARGET_OFFLINE");
    expect(lookups).toBe(1);
    expect(created).toBe(0);
    expect(turns).toBe(0);
    const row = await engine.store.getWorkflow(started.workflowId);
    expect(row?.status).toBe("failed");
    expect(outcome.summary).toContain("the target computer is offline");
  });

  it("S004-372: node scopes only narrow the origin's access and grants, also for nodes a node adds", async () => {
    const w = await world(db.pool);
    const gate = deferred();
    const { engine } = await w.engine(async ({ task }) => {
      if (taskLine(task) === "TASK a") await gate.promise;
      return `done ${taskLine(task)}`;
    });
    all.push(engine);
    const def = parseWorkflowDefinition(`
name: narrow
nodes:
  - { id: a, task: "TASK a", tools: { allow: [Read, Bash, Write], deny: [Write] } }
  - { id: b, task: "TASK b", readOnly: true }
`);
    const started = await engine.start(
      w.ctx({ access: { tools: { allow: ["Read", "Bash"], deny: ["Net"] } } }),
      {
        definition: def,
      },
    );
    await until(() => engine.run(started.workflowId)?.started.has("a") === true, "a running");
    await engine.addNodes({
      workflowId: started.workflowId,
      principalAccountId: w.accountId,
      fromNodeId: "a",
      nodes: [{ id: "c", task: "TASK c", tools: { allow: ["Bash", "Edit"] } }],
    });
    await until(async () => (await journal(started.workflowId)).nodeAccess.c !== undefined, "c prepared");
    const j = await journal(started.workflowId);
    const scope = (id: string) => JSON.parse(j.nodeAccess[id] as string);
    expect(scope("a").tools.allow.sort()).toEqual(["Bash", "Read"]);
    expect(scope("a").tools.deny.sort()).toEqual(["Net", "Write"]);
    expect(scope("b").permissionBoundary).toBe("read-only");
    expect(scope("b").tools.allow.sort()).toEqual(["Bash", "Read"]);
    // Added by a: a's stored access is the ceiling (no Edit, a's denies kept).
    expect(scope("c").tools.allow).toEqual(["Bash"]);
    expect(scope("c").tools.deny.sort()).toEqual(["Net", "Write"]);
    gate.resolve();
    expect((await engine.finished(started.workflowId)).status).toBe("completed");
  });
});

describe("output capture", () => {
  it("S004-183: a node's stored output names every tool-result reference across its child's context, not only the final text", async () => {
    const w = await world(db.pool);
    const spilled = randomUUID();
    const delegated = randomUUID();
    let firstTurns = 0;
    const msg = (message: unknown) => ({ body: { type: "message" as const, message: message as never } });
    // First process: a tool whose large output was spilled, then the process is lost mid-turn.
    const before = {
      async executeTurn(child: { sessionId: string; principalAccountId: string }, signal: AbortSignal) {
        firstTurns++;
        await w.repo.append(child.sessionId, child.principalAccountId, [
          msg({
            role: "assistant",
            content: [{ type: "toolCall", id: "call-1", name: "Bash", arguments: { command: "make test" } }],
            stopReason: "toolUse",
          }),
          msg({
            role: "toolResult",
            toolCallId: "call-1",
            toolName: "Bash",
            content: "(output spilled)",
            isError: false,
            details: { resultId: spilled, spillPath: "/spill/call-1.txt", byteSize: 90000 },
          }),
        ]);
        return untilAborted(signal);
      },
    };
    const one = parseWorkflowDefinition(`
name: capture
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);
    const first = await w.engine(() => "unused", {
      dispatcher: new JournalNodeDispatcher(w.repo, before),
    });
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: one });
    await until(
      async () =>
        firstTurns === 1 &&
        (await childMessages((await journal(started.workflowId)).nodes.a?.childSessionId ?? randomUUID()))
          .length === 3,
      "a in its tool",
    );
    const childA = (await journal(started.workflowId)).nodes.a?.childSessionId as string;
    await first.engine.close();
    const second = await w.engine(() => "unused", {
      dispatcher: new JournalNodeDispatcher(w.repo, {
        async executeTurn(child) {
          if (child.sessionId !== childA) return { stopReason: "stop", reply: "other done" };
          // After the restart: a delegated result is delivered, then the final answer.
          await w.repo.append(child.sessionId, child.principalAccountId, [
            msg({
              role: "custom",
              customType: "delegation_result",
              content: "sub-result",
              details: { resultId: delegated, outcome: "ok" },
            }),
            msg({ role: "assistant", content: [{ type: "text", text: "all green" }], stopReason: "stop" }),
          ]);
          return { stopReason: "stop", reply: "all green" };
        },
      }),
    });
    all.push(second.engine);
    await second.engine.recoverInterrupted();
    await until(
      async () => (await journal(started.workflowId)).nodes.a?.status === "succeeded",
      "a answered",
    );
    const j = await journal(started.workflowId);
    const a = j.nodes.a as { artifact: { sha256: string }; handover: string };
    const { workflowArtifactPath } = await import("../src/index.js");
    const content = await second.engine.artifacts.readArtifact(
      w.parentSessionId,
      workflowArtifactPath(started.workflowId, "a", a.artifact.sha256),
    );
    expect(content).toContain("all green");
    // The first (interrupted) turn's spilled tool output and the later delegated result are both named.
    expect(content).toContain(`result ${spilled}`);
    expect(content).toContain("output /spill/call-1.txt");
    expect(content).toContain(`result ${delegated}`);
    expect(a.handover).toBe("all green");
    await second.engine.finished(started.workflowId);
  });
});

describe("minimal composition", () => {
  it("S004-310: without shared artifacts no artifact is stored and no grant is minted; dependents get handovers only", async () => {
    const w = await world(db.pool);
    const prompts: Record<string, string> = {};
    const { engine } = await w.engine(
      ({ task }) => {
        prompts[taskLine(task)] = task;
        return `done ${taskLine(task)}`;
      },
      { sharedArtifacts: false },
    );
    all.push(engine);
    const chain = parseWorkflowDefinition(`
name: minimal
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);
    const started = await engine.start(w.ctx(), { definition: chain });
    expect((await engine.finished(started.workflowId)).status).toBe("completed");
    expect(prompts["TASK b"]).toContain("done TASK a");
    expect(prompts["TASK b"]).not.toContain("full result");
    const count = async (table: string) =>
      (
        await db.pool.query(`select count(*)::int n from ${table} where workflow_id = $1::uuid`, [
          started.workflowId,
        ])
      ).rows[0].n;
    expect(await count("workflow_artifacts")).toBe(0);
    expect(await count("workflow_artifact_grants")).toBe(0);
  });
});

describe("current access is rebuilt, never read from the journal", () => {
  it("S004-314: identity, permission policy and tool grants are rebuilt from the account as it is now", async () => {
    const { captureDelegatedExecutionScope } = await import("@crw/brain");
    const { boundaryAgainst, currentDelegatedAccess } = await import("../src/index.js");
    const w = await world(db.pool, { toolAllow: ["Read", "Bash"] });
    const journaled = captureDelegatedExecutionScope({
      accountId: w.accountId,
      operator: true,
      target: { kind: "host", ref: null },
      tools: { allow: ["Read", "Bash"] },
      permissionBoundary: "workspace-write",
    });
    const verdict = async () => {
      const current = await currentDelegatedAccess(w.repo, w.accountId, w.parentSessionId);
      if (!current.ok) throw new Error(current.reason);
      return boundaryAgainst(current.authority)({ subject: "n", scope: journaled });
    };
    expect(await verdict()).toEqual({ ok: true });
    // Identity: the account is no longer an owner; the journal's operator flag grants nothing.
    await db.pool.query("update accounts set is_owner = false where id = $1::uuid", [w.accountId]);
    expect(await verdict()).toMatchObject({ ok: false, reason: expect.stringContaining("operator") });
    await db.pool.query("update accounts set is_owner = true where id = $1::uuid", [w.accountId]);
    // Permission policy: the account's settings now say read-only.
    await db.pool.query(
      `update accounts set permission_settings = '{"permissionBoundary":"read-only"}' where id = $1::uuid`,
      [w.accountId],
    );
    expect(await verdict()).toMatchObject({
      ok: false,
      reason: expect.stringContaining("permissionBoundary"),
    });
    await db.pool.query(`update accounts set permission_settings = '{}' where id = $1::uuid`, [w.accountId]);
    // Tool grants: Bash is denied now.
    await db.pool.query("update accounts set tool_deny = '{Bash}' where id = $1::uuid", [w.accountId]);
    expect(await verdict()).toMatchObject({ ok: false });
    await db.pool.query("update accounts set tool_deny = '{}' where id = $1::uuid", [w.accountId]);
    expect(await verdict()).toEqual({ ok: true });
  });
});
