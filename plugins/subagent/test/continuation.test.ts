import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  JournalNodeDispatcher,
  type NodeContinueRequest,
  type NodeDispatcher,
  type NodeRecoveryHost,
  PgWorkflowStore,
  parseWorkflowDefinition,
  type RecoveryContinueNode,
  readOrchestrationJournal,
  scriptedNodeTurnRunner,
  type WorkflowEngine,
  type WorkflowEvent,
} from "../src/index.js";
import {
  deferred,
  interruptedMidTurn,
  oneNodeDefinition,
  storeWholeJournal,
  taskLine,
  until,
  untilAborted,
  world,
} from "./helpers.js";

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

describe("the engine's node cap", () => {
  it("the plugin's cap on executing nodes applies across workflows, on top of any runner queue (S004-189)", async () => {
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

/**
 * One planned child of the real dispatcher, continued in turn: by a positional call, with an empty
 * transcript and no task, with a task (and an event stream), after another process settled an answer in
 * its journal, and as an explicit retry.
 */
describe("canonical continuation", () => {
  type Messages = Awaited<ReturnType<typeof childMessages>>;
  const scopes: string[] = [];
  const turnContexts: string[][] = [];
  const scope = JSON.stringify({ stored: "scope" });
  let child: string;
  let positional: unknown;
  let afterPositional: Messages;
  let empty: unknown;
  let afterEmpty: Messages;
  let continued: unknown;
  const seen: string[] = [];
  let answered: unknown;
  let scopesAfterAnswered: number;
  let retried: unknown;
  let afterRetry: Messages;

  beforeAll(async () => {
    const w = await world(db.pool);
    const dispatcher = new JournalNodeDispatcher(w.repo, {
      async executeTurn(c, _signal, onEvent) {
        scopes.push(c.scope);
        const messages = await childMessages(c.sessionId);
        turnContexts.push(
          messages.map((m) => `${m.role}:${String(typeof m.content === "string" ? m.content : "")}`),
        );
        const last = messages.filter((m) => m.role === "user").at(-1);
        onEvent?.({ type: "text", text: "working" });
        const reply = `reply to ${String(last?.content)}`;
        await w.repo.append(c.sessionId, c.principalAccountId, [
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
    child = await dispatcher.createChild({
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
    positional = await (dispatcher.continueNode as unknown as (a: string, b: string) => Promise<unknown>)(
      child,
      "text",
    ).catch((e: unknown) => e);
    afterPositional = await childMessages(child);
    empty = await dispatcher.continueNode(input());
    afterEmpty = await childMessages(child);
    continued = await dispatcher.continueNode(input({ task: "first", onEvent: (e) => seen.push(e.type) }));
    // A settled answer written by another process, after this dispatcher's last turn.
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
    answered = await dispatcher.continueNode(input());
    scopesAfterAnswered = scopes.length;
    retried = await dispatcher.continueNode(input({ fallbackPrompt: "retry task" }));
    afterRetry = await childMessages(child);
  });

  it("a continuation takes one input object, with an optional event stream and retry task, and answers data (S004-343)", () => {
    expect(continued).toEqual({ status: "continued", reply: "reply to first" });
    // The event stream of the input object saw the turn's progress.
    expect(seen).toEqual(["text"]);
    // The same object without onEvent or fallbackPrompt is as valid (empty, answered); with one, a retry.
    expect(empty).toEqual({ status: "empty" });
    expect(answered).toEqual({ status: "answered", reply: "settled elsewhere" });
    expect(retried).toEqual({ status: "continued", reply: "reply to retry task" });
  });

  it("there is no positional (child, text) form: it throws a TypeError and journals nothing (S004-344)", () => {
    expect(positional).toBeInstanceOf(TypeError);
    expect(afterPositional).toEqual([]);
  });

  it("outcomes are told apart: answered and continued carry the reply, empty nothing (S004-383)", () => {
    expect(answered).toEqual({ status: "answered", reply: "settled elsewhere" });
    expect(continued).toEqual({ status: "continued", reply: "reply to first" });
    expect(empty).toEqual({ status: "empty" });
    expect(afterEmpty).toEqual([]);
  });

  it("a message-free continuation reads the child's settled journal, taking an answer another process wrote (S004-335)", () => {
    expect(answered).toEqual({ status: "answered", reply: "settled elsewhere" });
    // Nothing ran for it: the dispatcher's own last turn was the one before that answer.
    expect(scopesAfterAnswered).toBe(1);
  });

  it("without a retry task a settled answer is reused as the outcome, no new turn (S004-339)", () => {
    expect(answered).toEqual({ status: "answered", reply: "settled elsewhere" });
    expect(scopesAfterAnswered).toBe(1);
    expect(scopes).toHaveLength(2); // only the retry, given its task, ran another turn
  });

  it("a retry's result is its own new turn's reply, never the attempt already in the transcript (S004-338)", () => {
    expect(retried).toEqual({ status: "continued", reply: "reply to retry task" });
    expect(retried).not.toEqual(answered);
    expect(afterRetry.at(-1)).toMatchObject({
      role: "assistant",
      content: [{ type: "text", text: "reply to retry task" }],
    });
  });

  it("a retry sends its task as it is, as the child's next user message (S004-337)", () => {
    expect(afterRetry.at(-2)).toEqual({ role: "user", content: "retry task" });
    expect(afterRetry.filter((m) => m.content === "retry task")).toHaveLength(1);
    // The retry's turn was given the task directly, with no note or wrapper after it.
    expect(turnContexts.at(-1)?.at(-1)).toBe("user:retry task");
  });
});

describe("continuing an interrupted or foreign child", () => {
  it("a continuation without a retry task after an aborted retry notes the interruption instead of repeating the task", async () => {
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

  it("boot recovery of a retry interrupted mid-turn sends no second retry task: the child is told to verify first (S004-336)", async () => {
    const w = await world(db.pool);
    let turns = 0;
    const first = await w.engine(async ({ signal }) => {
      turns++;
      if (turns === 1) throw new Error("flaky provider");
      // The explicit retry's turn: in flight when its process stops.
      return untilAborted(signal);
    });
    all.push(first.engine);
    const ctx = w.ctx();
    const started = await first.engine.start(ctx, {
      definition: parseWorkflowDefinition('name: retried\nnodes:\n  - { id: n, task: "TASK n" }\n'),
    });
    expect((await first.engine.finished(started.workflowId)).status).toBe("failed");
    await first.engine.resume({ ...ctx, toolCallId: "resume-call" }, started.workflowId);
    await until(() => turns === 2, "the retry's turn in flight");
    await first.engine.close();
    const inputs: NodeContinueRequest[] = [];
    const second = await w.engine(() => "finished after verifying", {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        runNode: (r) => base.runNode(r),
        continueNode: (input, host) => {
          inputs.push(input);
          return base.continueNode(input, host);
        },
      }),
    });
    all.push(second.engine);
    await second.engine.recoverInterrupted();
    expect((await second.engine.finished(started.workflowId)).status).toBe("completed");
    // The boot may claim other interrupted workflows too: only this one's continuation is looked at.
    const own = inputs.filter((i) => i.workflowId === started.workflowId);
    expect(own.map((i) => i.fallbackPrompt)).toEqual([undefined]);
    const { rows } = await db.pool.query("select id from sessions where parent_session_id = $1::uuid", [
      w.parentSessionId,
    ]);
    expect(rows).toHaveLength(1);
    const messages = await childMessages(String(rows[0].id));
    // The task, the retry's task once, then the restart note: no third copy of the task.
    expect(messages.map((m) => m.customType ?? m.role)).toEqual(["user", "user", "interrupted", "assistant"]);
  });

  it("a child is continued only when it is durably a delegated child of the workflow's parent; no identity is no wildcard (S004-328 S004-363)", async () => {
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
    // A real child of the workflow's parent exists: a request naming no child must still not reach it.
    const own = await dispatcher.createChild({
      workflowId: "wf",
      nodeId: "n",
      parentSessionId: w.parentSessionId,
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
    expect(await childMessages(own)).toEqual([]);
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

/** The runner seam's requests (what a node turn's runner is handed), recorded as they arrive. */
function recordingRunner(
  answer: Parameters<typeof scriptedNodeTurnRunner>[0],
  log: Array<Record<string, unknown>>,
) {
  const inner = scriptedNodeTurnRunner(answer);
  return {
    runTurn: (request: Parameters<typeof inner.runTurn>[0], host: Parameters<typeof inner.runTurn>[1]) => {
      log.push({ ...request });
      return inner.runTurn(request, host);
    },
  };
}

type HookCall = { input: NodeContinueRequest; host?: NodeRecoveryHost };
const functionKeys = (o: object) =>
  Object.entries(o)
    .filter(([, v]) => typeof v === "function")
    .map(([k]) => k);

/**
 * One host continueNode (the recovery hook's type) serves a boot recovery of a planned child whose
 * transcript is empty (which needs startFresh). A failed node retried by an explicit WorkflowResume is the
 * live caller. Every hook call, engine dispatcher call, node dispatch request and runner request is recorded.
 */
describe("recovery hooks", () => {
  const hostCalls: HookCall[] = [];
  const bootEngineCalls: HookCall[] = [];
  const runnerRequests: Array<Record<string, unknown>> = [];
  const nodeRequests: Array<Record<string, unknown>> = [];
  let hostContinue: RecoveryContinueNode;
  let bootHeld: Awaited<ReturnType<typeof journal>>;
  let bootFirstMessage: unknown;
  let bootProgress: boolean;
  let bootOutcome: string | null;
  const resumeCalls: HookCall[] = [];
  const resumeResults: unknown[] = [];
  let resumeRowAtCall: { generation: number; status: string; locked_by: string | null } | undefined;
  let resumeOwner: string;
  let failedJournal: Awaited<ReturnType<typeof journal>>;
  let resumedOutcome: string | null;
  let retryMessages: Awaited<ReturnType<typeof childMessages>>;
  let runnerRequestsOfResume: Array<Record<string, unknown>>;

  beforeAll(async () => {
    const w = await world(db.pool);
    const base = new JournalNodeDispatcher(
      w.repo,
      recordingRunner(({ task }) => `hooked ${taskLine(task)}`, runnerRequests),
    );
    // The host's own continueNode: the type boot recovery's hook takes.
    hostContinue = (input, host) => {
      hostCalls.push({ input, ...(host ? { host } : {}) });
      return base.continueNode(input, host);
    };

    // Boot recovery of a planned child with an empty transcript (its process let go before the prompt).
    const first = await w.engine(() => "never", {
      wrap: (b): NodeDispatcher => ({
        createChild: (r) => b.createChild(r),
        runNode: (r) => untilAborted(r.signal),
        continueNode: (i, h) => b.continueNode(i, h),
      }),
    });
    all.push(first.engine);
    const bootStarted = await first.engine.start(w.ctx(), { definition: oneNodeDefinition });
    await until(() => first.engine.run(bootStarted.workflowId)?.started.has("a") === true, "a running");
    await first.engine.close();
    bootHeld = await journal(bootStarted.workflowId);
    const second = await w.engine(() => "never", {
      wrap: (b): NodeDispatcher => ({
        createChild: (r) => b.createChild(r),
        runNode: (r) => b.runNode(r),
        continueNode: (input, host) => {
          bootEngineCalls.push({ input, ...(host ? { host } : {}) });
          return b.continueNode(input, host);
        },
      }),
    });
    all.push(second.engine);
    await second.engine.recoverInterrupted(1000, { continueNode: hostContinue });
    bootOutcome = (await second.engine.finished(bootStarted.workflowId)).status;
    bootFirstMessage = (await childMessages(bootHeld.nodes.a?.childSessionId as string))[0];
    bootProgress = second.events.some((e) => e.type === "node_progress" && e.nodeId === "a");

    // The live caller: an explicit WorkflowResume of a failed node.
    let fail = true;
    const liveRunner = recordingRunner(({ task }) => {
      if (fail) throw new Error("provider down");
      return `done ${taskLine(task)}`;
    }, runnerRequests);
    const live = new JournalNodeDispatcher(w.repo, liveRunner);
    resumeOwner = `resume-${randomUUID()}`;
    const { engine } = await w.engine(() => "unused", {
      owner: resumeOwner,
      dispatcher: {
        createChild: (r) => live.createChild(r),
        runNode: (r) => {
          nodeRequests.push({ ...r });
          return live.runNode(r);
        },
        continueNode: async (input, host) => {
          resumeCalls.push({ input, ...(host ? { host } : {}) });
          resumeRowAtCall = (
            await db.pool.query("select generation, status, locked_by from workflows where id = $1::uuid", [
              input.workflowId,
            ])
          ).rows[0];
          const result = await live.continueNode(input, host);
          resumeResults.push(result);
          return result;
        },
      },
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNodeDefinition });
    expect((await engine.finished(started.workflowId)).status).toBe("failed");
    failedJournal = await journal(started.workflowId);
    fail = false;
    const before = runnerRequests.length;
    await engine.resume(w.ctx({ toolCallId: `call-${randomUUID()}` }), started.workflowId);
    resumedOutcome = (await engine.finished(started.workflowId)).status;
    runnerRequestsOfResume = runnerRequests.slice(before);
    retryMessages = await childMessages(failedJournal.nodes.a?.childSessionId as string);
  });

  const bootCall = () => hostCalls[0] as HookCall;
  const resumeCall = () => resumeCalls[0] as HookCall;

  it("only the recovery hook (a boot) is handed startFresh; the live WorkflowResume is not (S004-345)", () => {
    expect(hostCalls).toHaveLength(1);
    expect(typeof bootCall().host?.startFresh).toBe("function");
    expect(resumeCalls).toHaveLength(1);
    expect(resumeCall().host?.startFresh).toBeUndefined();
  });

  it("startFresh reaches a boot only through the host's continueNode, and builds the original task there (S004-424)", () => {
    // The engine's own dispatcher was not used, and the input object does not carry the callback.
    expect(bootEngineCalls).toEqual([]);
    expect("startFresh" in bootCall().input).toBe(false);
    expect(bootFirstMessage).toEqual({ role: "user", content: "TASK a" });
    expect(bootOutcome).toBe("completed");
  });

  it("the hook takes one input object with its event stream and the stored node scope (S004-382)", () => {
    expect(Object.keys(bootCall().input).sort()).toEqual([
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
    expect(functionKeys(bootCall().input)).toEqual(["onEvent"]);
    expect(bootCall().input.scope).toBe(bootHeld.nodeAccess.a);
    expect(bootProgress).toBe(true);
    // The optional retry task appears only where a retry was asked for.
    expect(resumeCall().input.fallbackPrompt).toBe("TASK a");
  });

  it("neither the dispatch proof nor startFresh enters a continuation's input, a node dispatch or a runner request (S004-354)", () => {
    for (const call of [bootCall(), resumeCall()]) {
      expect(functionKeys(call.input)).toEqual(["onEvent"]);
      expect(
        Object.values(call.input).some((v) => typeof v === "object" && v !== null && "assertDispatch" in v),
      ).toBe(false);
    }
    expect(nodeRequests.length).toBeGreaterThan(0);
    for (const r of [...nodeRequests, ...runnerRequests]) {
      expect("startFresh" in r).toBe(false);
      expect(functionKeys(r).filter((k) => k !== "onEvent")).toEqual([]);
      expect(Object.values(r).some((v) => typeof v === "object" && v !== null && "assertDispatch" in v)).toBe(
        false,
      );
    }
  });

  it("the live WorkflowResume's input and its runner requests carry no startFresh (S004-429)", () => {
    expect("startFresh" in resumeCall().input).toBe(false);
    expect(resumeCall().host?.startFresh).toBeUndefined();
    expect(runnerRequestsOfResume.length).toBe(1);
    expect(runnerRequestsOfResume.every((r) => !("startFresh" in r))).toBe(true);
    expect(resumedOutcome).toBe("completed");
  });

  it("the live WorkflowResume hands continueNode the one input object the recovery hook takes, its retry task added, and takes one outcome back as data (S004-427)", () => {
    const recoveryKeys = Object.keys(bootCall().input);
    expect(Object.keys(resumeCall().input).sort()).toEqual([...recoveryKeys, "fallbackPrompt"].sort());
    expect(resumeCall().input.childSessionId).toBe(failedJournal.nodes.a?.childSessionId);
    expect(resumeResults).toEqual([{ status: "continued", reply: "done TASK a" }]);
    expect(resumedOutcome).toBe("completed");
  });

  it("the live caller's retry is data only: a task string, no fresh callback or other host argument (S004-428)", () => {
    expect(resumeCall().input.fallbackPrompt).toBe("TASK a");
    expect(Object.keys(resumeCall().host ?? {})).toEqual([]);
    expect(functionKeys(resumeCall().input)).toEqual(["onEvent"]);
  });

  it("a retry task is an explicit retry in the failed node's own child and stored scope, after the generation advanced (S004-332)", () => {
    expect(resumeCall().input.childSessionId).toBe(failedJournal.nodes.a?.childSessionId);
    expect(resumeCall().input.scope).toBe(failedJournal.nodeAccess.a);
    // Dispatched under the native admission the resume took: a new generation, running, held by this owner.
    expect(resumeRowAtCall).toEqual({ generation: 2, status: "running", locked_by: resumeOwner });
    // The retry task is the child's new user message, answered by a new turn.
    expect(retryMessages.filter((m) => m.role === "user").map((m) => m.content)).toEqual([
      "TASK a",
      "TASK a",
    ]);
    expect(retryMessages.at(-1)).toMatchObject({ role: "assistant" });
  });
});

describe("an empty continuation", () => {
  it("an empty continuation refuses: the node fails, no fresh dispatch bypasses the owner, no completion is inferred (S004-348 S004-425)", async () => {
    const w = await world(db.pool);
    const chain = parseWorkflowDefinition(`
name: chain
nodes:
  - { id: remote, task: "TASK remote" }
  - { id: after, task: "TASK after", dependsOn: [remote] }
`);
    const started = await interruptedMidTurn(w, chain, "remote");
    const children = async () =>
      (
        await db.pool.query("select count(*)::int n from sessions where parent_session_id = $1::uuid", [
          w.parentSessionId,
        ])
      ).rows[0].n;
    const before = await children();
    let fresh = 0;
    // Boot recovery continues remote's child, and the continuation finds nothing to continue.
    const { engine, events } = await w.engine(() => "never", {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        runNode: async (r) => {
          fresh++;
          return base.runNode(r);
        },
        continueNode: async () => ({ status: "empty" }),
      }),
    });
    all.push(engine);
    await engine.recoverInterrupted();
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("failed");
    const j = await journal(started.workflowId);
    expect(j.nodes.remote?.status).toBe("failed");
    expect(j.nodes.remote?.error?.code).toBe("empty_continuation");
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

describe("boot recovery declarations", () => {
  it("boot adopts the native generation as recorded (never from the run number) and never calls the explicit-resume bridge (S004-394 S004-403)", async () => {
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

  it("opening an engine over interrupted workflows starts no turn, timer or write by itself (S004-401)", async () => {
    const w = await world(db.pool);
    const first = await w.engine(({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const started = await first.engine.start(w.ctx(), { definition: oneNodeDefinition });
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
  it("a typed preparation failure reaches the node unchanged (same error as cause, same code), with no fallback or reattempt (S004-371)", async () => {
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

  it("node scopes only narrow the origin's access and grants, also for nodes a node adds (S004-372)", async () => {
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
  it("a node's stored output names every tool-result reference across its child's context, not only the final text (S004-183)", async () => {
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
    // The workflow completes and its journal goes with the delivered summary: node a's output is read from
    // its stored artifact (the parent's grant names it), not from a journal that may be gone by then.
    await second.engine.finished(started.workflowId);
    const grant = (await second.engine.artifacts.grantsOf(w.parentSessionId)).find(
      (g) => g.workflowId === started.workflowId && g.nodeId === "a",
    );
    const content = await second.engine.artifacts.readArtifact(w.parentSessionId, grant?.path ?? "");
    expect(content).toContain("all green");
    // The first (interrupted) turn's spilled tool output and the later delegated result are both named.
    expect(content).toContain(`result ${spilled}`);
    expect(content).toContain("output /spill/call-1.txt");
    expect(content).toContain(`result ${delegated}`);
    // its handover, the final text, is what the parent's summary carries for it
    const summary = await db.pool.query<{ body: string }>(
      "select body from delegation_results where parent_session_id = $1 and kind = 'workflow_summary'",
      [w.parentSessionId],
    );
    expect(summary.rows.map((r) => r.body).join("\n")).toContain("all green");
  });
});

describe("minimal composition", () => {
  it("without shared artifacts no artifact is stored and no grant is minted; dependents get handovers only (S004-310)", async () => {
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
  it("identity, permission policy and tool grants are rebuilt from the account as it is now", async () => {
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
