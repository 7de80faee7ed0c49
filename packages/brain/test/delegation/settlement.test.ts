import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import {
  createScriptedTurnRunner,
  type ProgressEvent,
  parseDelegatedExecutionScope,
} from "../../src/index.js";
import {
  answeredChild,
  continueForeground,
  delegateBackground,
  delegateCall,
  delegateForeground,
  gatedHelperTask,
  gateTool,
  latch,
  makeService,
  messages,
  newParent,
  scriptTask,
  settledHelperResult,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

/** A child whose call settled, and whose next turn (a drain's follow-up) fails. */
async function childFailingNextTurn(service: ReturnType<typeof makeService>["service"]) {
  const { account, parent } = await newParent(service);
  const first = await delegateForeground(
    service,
    { parent, account },
    "c",
    scriptTask({ answer: "first", failAtRequest: 1 }),
  );
  if (first.kind !== "result") throw new Error("expected result");
  const child = await service.repo.getSession(first.childSessionId, account.id);
  return { account, child, scope: parseDelegatedExecutionScope(child.scope ?? "") };
}

describe("settlement of a child's call", () => {
  it("a call settles only after its helpers' results were processed, with the newest reply (S004-046 S004-049)", async () => {
    const gates = new Map<string, Promise<void>>();
    const { service, repo } = makeService(db.pool, { tools: () => [gateTool("Gate", gates)] });
    const { account, parent } = await newParent(service);
    const helper = latch();
    gates.set("helper", helper.promise);
    const receipt = await delegateBackground(
      service,
      { parent, account },
      "c",
      scriptTask({
        rounds: [
          [
            delegateCall(
              { rounds: [[{ name: "Gate", arguments: { key: "helper" } }]], answer: "helper done" },
              { background: true },
            ),
          ],
        ],
        answer: "C done",
        followUp: "C folded in",
      }),
    );
    if (receipt.kind !== "started") throw new Error("expected background");
    const child = receipt.childSessionId;
    // C's own turn ends, but a live helper keeps its call open
    await waitFor(async () => {
      const msgs = messages(await repo.readJournal(child, account.id));
      return msgs.some(
        (m) => m.role === "assistant" && m.content.some((c) => c.type === "text" && c.text === "C done"),
      );
    }, "C's first answer");
    expect((await repo.openRunForChild(child, account.id))?.status).toMatch(/running|settling/);
    expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([]);
    helper.open();
    await waitFor(
      async () => (await repo.settledResultIds(parent.id, account.id)).length === 1,
      "C's result delivered",
    );
    await service.whenIdle();
    const delivered = messages(await repo.readJournal(parent.id, account.id)).find(
      (m) => m.role === "custom",
    );
    expect(delivered?.content.endsWith("\nC folded in (1)")).toBe(true);
    const childMsgs = messages(await repo.readJournal(child, account.id));
    const helperAt = childMsgs.findIndex((m) => m.role === "custom");
    expect(childMsgs[helperAt + 1]).toMatchObject({
      role: "assistant",
      content: [{ type: "text", text: "C folded in (1)" }],
    });
  });

  it("a failed drain carries result id, reason and cause to every joined caller; nothing is requeued (S004-052 S004-053 S004-051)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, child, scope } = await childFailingNextTurn(service);
    // a helper result waits in the child's inbox
    const resultId = await settledHelperResult(repo, child, account.id, "h", "helper says");
    const [a, b] = await Promise.all([
      service.drainPendingResults(child, scope, () => {}),
      service.drainPendingResults(child, scope, () => {}),
    ]);
    expect(a).toBe(b);
    expect(a).toMatchObject({ kind: "failed", resultId, reason: "scripted provider failure" });
    expect(a.kind === "failed" && a.cause).toMatchObject({ message: "scripted provider failure" });
    expect(await repo.queuedResultIds(child.id, account.id)).toEqual([]);
    expect(await repo.settledResultIds(child.id, account.id)).toEqual([resultId]);
  });

  it("a settling call whose follow-up fails at the provider, after its helper's result was acknowledged, fails; that result stays delivered (S004-051)", async () => {
    const gates = new Map<string, Promise<void>>();
    const { service, repo } = makeService(db.pool, { tools: () => [gateTool("Gate", gates)] });
    const { account, parent } = await newParent(service);
    const helper = latch();
    gates.set("helper", helper.promise);
    const receipt = await delegateBackground(
      service,
      { parent, account },
      "c",
      scriptTask({
        rounds: [
          [
            delegateCall(
              { rounds: [[{ name: "Gate", arguments: { key: "helper" } }]], answer: "helper done" },
              { background: true },
            ),
          ],
        ],
        answer: "C done",
        // the third request of this plan: the follow-up that answers the helper's result
        failAtRequest: 2,
      }),
    );
    if (receipt.kind !== "started") throw new Error("expected background");
    const child = receipt.childSessionId;
    await waitFor(async () => {
      const msgs = messages(await repo.readJournal(child, account.id));
      return msgs.some(
        (m) => m.role === "assistant" && m.content.some((c) => c.type === "text" && c.text === "C done"),
      );
    }, "C's first answer");
    helper.open();
    await waitFor(
      async () => (await repo.runForToolCall(parent.id, "c", account.id))?.status === "failed",
      "C's call failed",
    );
    await service.whenIdle();
    const helperResults = await db.pool.query<{ id: string }>(
      "select id from delegation_results where parent_session_id = $1",
      [child],
    );
    expect(helperResults.rows).toHaveLength(1);
    const helperResult = helperResults.rows[0]?.id;
    // the result went into C's journal and was acknowledged before the failed request; it is not queued again
    expect(await repo.settledResultIds(child, account.id)).toEqual([helperResult]);
    expect(await repo.queuedResultIds(child, account.id)).toEqual([]);
    const msgs = messages(await repo.readJournal(child, account.id));
    const resultAt = msgs.findIndex((m) => m.role === "custom" && m.details?.resultId === helperResult);
    expect(msgs[resultAt + 1]).toMatchObject({ role: "assistant", stopReason: "error" });
    // the parent is told of the failure with C's own error result
    const result = await repo.resultForRun(
      (await repo.runForToolCall(parent.id, "c", account.id))?.id as string,
      account.id,
    );
    expect(result).toMatchObject({ outcome: "error" });
  });

  it("a drain stopped while its turn fails ends aborted, not failed, whether the turn returns or throws (S004-054)", async () => {
    let stop = new AbortController();
    let failing: { sessionId: string; way: "return" | "throw" } | undefined;
    const failed: string[] = [];
    const base = createScriptedTurnRunner();
    const { service, repo } = makeService(db.pool, {
      runner: {
        async runTurn(request, host) {
          if (failing?.sessionId !== request.sessionId) return base.runTurn(request, host);
          // the stop arrives while the provider request is in flight, and the request then fails
          stop.abort();
          failed.push(failing.way);
          if (failing.way === "throw") throw new Error("provider down");
          return { stopReason: "error", errorMessage: "provider down" };
        },
      },
    });
    for (const way of ["return", "throw"] as const) {
      const { account, parent } = await newParent(service);
      const child = await service.repo.getSession(
        await answeredChild(service, { parent, account }, "c", "first"),
        account.id,
      );
      await repo.enqueueSteer(child.id, account.id, "more");
      stop = new AbortController();
      failing = { sessionId: child.id, way };
      const out = await service.drainPendingResults(
        child,
        parseDelegatedExecutionScope(child.scope ?? ""),
        () => {},
        stop.signal,
      );
      expect(out).toEqual({ kind: "aborted" });
      failing = undefined;
    }
    // both drains reached the provider and failed there, after the stop
    expect(failed).toEqual(["return", "throw"]);
  });

  it("a failed drain's cause keeps the thrown failure's name, code and message (S004-052)", async () => {
    const failing = new Set<string>();
    const base = createScriptedTurnRunner();
    const { service, repo } = makeService(db.pool, {
      runner: {
        async runTurn(request, host) {
          if (!failing.has(request.sessionId)) return base.runTurn(request, host);
          throw Object.assign(new Error("rate limited"), { name: "ProviderError", code: "rate_limited" });
        },
      },
    });
    const { account, parent } = await newParent(service);
    const child = await service.repo.getSession(
      await answeredChild(service, { parent, account }, "c", "first"),
      account.id,
    );
    const resultId = await settledHelperResult(repo, child, account.id, "h", "helper says");
    failing.add(child.id);
    const out = await service.drainPendingResults(
      child,
      parseDelegatedExecutionScope(child.scope ?? ""),
      () => {},
    );
    expect(out).toMatchObject({ kind: "failed", resultId, reason: "rate limited" });
    expect(out.kind === "failed" && out.cause).toMatchObject({
      name: "ProviderError",
      code: "rate_limited",
      message: "rate limited",
    });
  });

  it("a failed drain that took only a text follow-up carries no result id (S004-052)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, child, scope } = await childFailingNextTurn(service);
    await repo.enqueueSteer(child.id, account.id, "one more thing");
    const out = await service.drainPendingResults(child, scope, () => {});
    expect(out).toMatchObject({ kind: "failed", reason: "scripted provider failure" });
    expect(out.kind === "failed" && out.resultId).toBeUndefined();
    await service.close();
  });

  it("a text follow-up admitted while the call settles runs in the bracket and reports through the call's sink (S004-047)", async () => {
    const gates = new Map<string, Promise<void>>();
    const { service, repo } = makeService(db.pool, { tools: () => [gateTool("Gate", gates)] });
    const { account, parent } = await newParent(service);
    const helper = latch();
    gates.set("h", helper.promise);
    const texts: string[] = [];
    const receipt = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "c",
      task: gatedHelperTask("h", "h done", { answer: "C done", followUp: "C took" }),
      mode: "background",
      progress: (e) => {
        if (e.type === "text") texts.push(e.text);
      },
    });
    if (receipt.kind !== "started") throw new Error("expected background");
    const child = receipt.childSessionId;
    await waitFor(async () => texts.includes("C done"), "C's own turn ended");
    const steer = await continueForeground(service, { parent, account }, child, "s", "and also this");
    expect(steer.kind).toBe("steered");
    helper.open();
    await waitFor(
      async () => (await repo.settledResultIds(parent.id, account.id)).length === 1,
      "C delivered",
    );
    await service.whenIdle();
    // the steer and the helper result were taken in one follow-up turn inside the settling call
    expect(texts.filter((t) => t.startsWith("C "))).toEqual(["C done", "C took (2)"]);
    const delivered = messages(await repo.readJournal(parent.id, account.id)).find(
      (m) => m.role === "custom",
    );
    expect(delivered?.content.endsWith("\nC took (2)")).toBe(true);
  });

  it("a follow-up turn that takes only a text steer reports through the call's sink (S004-062)", async () => {
    let steerAfterTurn: ((childId: string) => Promise<void>) | undefined;
    const base = createScriptedTurnRunner();
    const { service } = makeService(db.pool, {
      runner: {
        async runTurn(request, host) {
          const out = await base.runTurn(request, host);
          // The steer comes after the call's own turn took its last steering, while that turn still holds
          // the child: only a follow-up turn of the settling call can take it.
          const steer = steerAfterTurn;
          steerAfterTurn = undefined;
          await steer?.(request.sessionId);
          return out;
        },
      },
    });
    const caller = await newParent(service);
    const steered: string[] = [];
    steerAfterTurn = async (childId) => {
      steered.push((await continueForeground(service, caller, childId, "s", "and also this")).kind);
    };
    const texts: string[] = [];
    const receipt = await service.delegate({
      parentSessionId: caller.parent.id,
      principalAccountId: caller.account.id,
      toolCallId: "c",
      task: scriptTask({ answer: "C done", followUp: "C took" }),
      mode: "foreground",
      progress: (e) => {
        if (e.type === "text") texts.push(e.text);
      },
    });
    expect(steered).toEqual(["steered"]);
    expect(receipt).toMatchObject({ kind: "result", body: "C took (1)" });
    expect(texts).toEqual(["C done", "C took (1)"]);
    await service.whenIdle();
  });
});

/**
 * A foreground call's child delegates a helper in the background and answers; the helper's result then
 * arrives while the call is still open, and the child's result turn answers it ("C got it (1)"). The
 * helper waits at a gate until the child's own answer is journaled: delivered sooner, its result would
 * join the child's own turn.
 */
describe("the result turns of an open call", () => {
  let events: ProgressEvent[];
  let receipt: Awaited<ReturnType<ReturnType<typeof makeService>["service"]["delegate"]>>;
  let parentId: string;
  beforeAll(async () => {
    const gates = new Map<string, Promise<void>>();
    const helperGate = latch();
    gates.set("helper", helperGate.promise);
    const { service, repo } = makeService(db.pool, { tools: () => [gateTool("Gate", gates)] });
    const { account, parent } = await newParent(service);
    parentId = parent.id;
    events = [];
    const call = service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "c",
      task: gatedHelperTask("helper", "helper done", { answer: "C done", followUp: "C got it" }),
      mode: "foreground",
      progress: (e) => events.push(e),
    });
    const childOf = () => {
      const e = events.find((x) => x.type === "session" && x.parentSessionId === parent.id);
      return e?.type === "session" ? e.sessionId : undefined;
    };
    await waitFor(async () => {
      const child = childOf();
      if (!child) return false;
      const last = messages(await repo.readJournal(child, account.id)).at(-1);
      return last?.role === "assistant" && JSON.stringify(last.content).includes("C done");
    }, "the child's own answer journaled");
    helperGate.open();
    receipt = await call;
    await service.whenIdle();
  });

  it("a helper result's turn in an open call reports to the call's sink", () => {
    expect(receipt).toMatchObject({ kind: "result", body: "C got it (1)" });
    expect(events.flatMap((e) => (e.type === "text" ? [e.text] : []))).toContain("C got it (1)");
  });

  it("the result turn's session identity events stay out of the inherited sink: only the call's own (S004-060)", () => {
    expect(events.filter((e) => e.type === "session")).toEqual([
      {
        type: "session",
        sessionId: receipt.kind === "result" ? receipt.childSessionId : "",
        parentSessionId: parentId,
      },
    ]);
  });

  it("the caller's sink hears each event once, the result turn's included (S004-061)", () => {
    const texts = events.flatMap((e) => (e.type === "text" ? [e.text] : []));
    expect(texts.filter((t) => t === "C got it (1)")).toHaveLength(1);
    expect(new Set(texts).size).toBe(texts.length);
    expect(events.filter((e) => e.type === "tool" && e.toolName === "Delegate")).toHaveLength(1);
  });
});

/**
 * A child C delegates a helper in the background and then waits in a Gate call. The helper answers only
 * once C waits there, and C's Gate opens once the helper's result is in C's inbox: the result arrives while
 * C's turn runs, between two of its tool rounds.
 */
describe("a helper's result steered into its running parent child", () => {
  let repo: ReturnType<typeof makeService>["repo"];
  let accountId: string;
  let child: string;
  beforeAll(async () => {
    const gates = new Map<string, Promise<void>>();
    const made = makeService(db.pool, { tools: () => [gateTool("Gate", gates)] });
    const service = made.service;
    repo = made.repo;
    const { account, parent } = await newParent(service);
    accountId = account.id;
    const cWaits = latch();
    gates.set("h", cWaits.promise);
    const helperQueued = latch();
    gates.set("c", helperQueued.promise);
    const receipt = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "c",
      task: scriptTask({
        rounds: [
          [
            delegateCall(
              { rounds: [[{ name: "Gate", arguments: { key: "h" } }]], answer: "helper result" },
              { background: true },
            ),
          ],
          [{ name: "Gate", arguments: { key: "c" } }],
        ],
        answer: "C answered",
      }),
      mode: "background",
    });
    if (receipt.kind !== "started") throw new Error("expected background");
    child = receipt.childSessionId;
    await waitFor(async () => {
      const msgs = messages(await repo.readJournal(child, account.id));
      return msgs.some(
        (m) => m.role === "assistant" && m.content.some((c) => c.type === "toolCall" && c.name === "Gate"),
      );
    }, "C in its Gate call");
    cWaits.open();
    await waitFor(async () => {
      const q = await db.pool.query("select 1 from delegation_results where parent_session_id = $1", [child]);
      return q.rowCount === 1;
    }, "helper settled into the child");
    helperQueued.open();
    await waitFor(
      async () => (await repo.settledResultIds(parent.id, account.id)).length === 1,
      "C delivered",
    );
    await service.whenIdle();
  });

  it("lands between two tool rounds of the running turn, journaled with the id its delivery acknowledged (S004-036)", async () => {
    const msgs = messages(await repo.readJournal(child, accountId));
    const gateAt = msgs.findIndex((m) => m.role === "toolResult" && m.toolName === "Gate");
    const settled = await repo.settledResultIds(child, accountId);
    expect(settled).toHaveLength(1);
    expect(msgs[gateAt + 1]).toMatchObject({
      role: "custom",
      customType: "delegation_result",
      details: { resultId: settled[0] },
    });
    expect(msgs[gateAt + 2]).toMatchObject({
      role: "assistant",
      content: [{ type: "text", text: "C answered" }],
    });
    expect(msgs).toHaveLength(gateAt + 3);
    expect(await repo.queuedResultIds(child, accountId)).toEqual([]);
  });

  it("writes no steer receipt and stamps no steer id on a result row (S004-037)", async () => {
    const steers = await db.pool.query(
      "select 1 from delegated_steers d join sessions s on s.id = d.child_session_id where s.principal_account_id = $1",
      [accountId],
    );
    expect(steers.rowCount).toBe(0);
    const bodies = await db.pool.query<{ body: string }>(
      "select j.body from journal_entries j join sessions s on s.id = j.session_id where s.principal_account_id = $1 and j.result_id is not null",
      [accountId],
    );
    // the helper's result in C, and C's own result in its parent
    expect(bodies.rowCount).toBe(2);
    for (const r of bodies.rows) expect(r.body).not.toContain("delegatedSteerId");
  });
});
