import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  createScriptedTurnRunner,
  DelegationError,
  delegationTools,
  parseDelegatedExecutionScope,
  type SessionTurnRunner,
} from "../../src/index.js";
import {
  delegateForeground,
  gateTool,
  latch,
  makeService,
  newParent,
  resultIdsIn,
  scriptTask,
  settledHelperResult,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

/**
 * A workflow ends as the workflow engine ends it in the daemon: its summary goes into the recipient's inbox,
 * then the host's completion hook hands the result id to the delegation core.
 */
async function workflowFinished(
  service: ReturnType<typeof makeService>["service"],
  recipient: { sessionId: string; principalAccountId: string },
  toolCallId: string,
  summary: string,
): Promise<string> {
  const queued = await service.repo.enqueueWorkflowSummary({
    resultId: randomUUID(),
    parentSessionId: recipient.sessionId,
    principalAccountId: recipient.principalAccountId,
    toolCallId,
    outcome: "ok",
    body: summary,
    byteSize: Buffer.byteLength(summary),
  });
  await service.resultQueued(recipient.sessionId, recipient.principalAccountId, queued.resultId);
  return queued.resultId;
}

describe("delivery and bracket edges", () => {
  it("a result that arrives as the parent's turn ends (after its last drain) is not stranded: one follow-up delivers it once (S004-041)", async () => {
    const scripted = createScriptedTurnRunner();
    const hook: { atTurnEnd?: (sessionId: string) => Promise<void> } = {};
    const runner: SessionTurnRunner = {
      async runTurn(request, host) {
        const outcome = await scripted.runTurn(request, host);
        // The turn has made its last steering drain and produced its answer, and still holds the session.
        await hook.atTurnEnd?.(request.sessionId);
        return outcome;
      },
    };
    const { service, repo } = makeService(db.pool, { runner });
    const { account, parent } = await newParent(service);
    let resultId = "";
    hook.atTurnEnd = async (sessionId) => {
      if (sessionId !== parent.id || resultId) return;
      resultId = await workflowFinished(
        service,
        { sessionId: parent.id, principalAccountId: account.id },
        "wf-1",
        "the workflow finished",
      );
      // Nobody can take it now: the turn is past its last drain and the session is still held.
      expect(service.turns.isBusy(parent.id)).toBe(true);
      expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([resultId]);
    };
    const outcome = await service.prompt(parent.id, account.id, "hello");
    expect(outcome.stopReason).toBe("stop");
    await service.whenIdle();
    expect(resultId).not.toBe("");
    expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([]);
    const journal = await repo.readJournal(parent.id, account.id);
    expect(resultIdsIn(journal)).toEqual([resultId]);
    // The follow-up turn answered it: the journal ends with an assistant reply after the delivered result.
    const last = journal.at(-1)?.body;
    expect(last?.type === "message" && last.message.role).toBe("assistant");
    await service.close();
  });

  it("concurrent bracket callers and the owner's drain share one delivery authority and the session lock: each result is journaled once, the turns run one after another, nothing is left for later (S004-063)", async () => {
    const scripted = createScriptedTurnRunner();
    const spans: Array<{ session: string; from: number; to: number }> = [];
    let clock = 0;
    const runner: SessionTurnRunner = {
      async runTurn(request, host) {
        const from = ++clock;
        const outcome = await scripted.runTurn(request, host);
        spans.push({ session: request.sessionId, from, to: ++clock });
        return outcome;
      },
    };
    const { service, repo } = makeService(db.pool, { runner });
    const { account, parent } = await newParent(service);
    const first = await delegateForeground(
      service,
      { parent, account },
      "c",
      scriptTask({ answer: "ready", followUp: "took it" }),
    );
    if (first.kind !== "result") throw new Error("expected a result");
    const child = await repo.getSession(first.childSessionId, account.id);
    const resultIds: string[] = [];
    for (let i = 0; i < 5; i++) {
      const resultId = await settledHelperResult(repo, child, account.id, `h${i}`, `helper ${i}`);
      resultIds.push(resultId);
    }
    const scope = parseDelegatedExecutionScope(child.scope ?? "");
    const outs = await Promise.all([
      service.runChildTurn(child, scope, () => {}),
      service.runChildTurn(child, scope, () => {}),
      service.drainInto(child).then((messages) => ({ delivered: messages, outcome: null, reply: undefined })),
      service.runChildTurn(child, scope, () => {}),
    ]);
    const journal = await repo.readJournal(child.id, account.id);
    // Every helper result exactly once, in FIFO order, acknowledged; nothing waits.
    expect(resultIdsIn(journal)).toEqual(resultIds);
    expect(await repo.queuedResultIds(child.id, account.id)).toEqual([]);
    const claimed = outs.flatMap((o) =>
      o.delivered.map((d) =>
        typeof d === "string" ? d : d.role === "custom" ? d.details?.resultId : undefined,
      ),
    );
    expect(claimed.filter(Boolean).sort()).toEqual([...resultIds].sort());
    // The bracket callers each ran one turn, one after another (the session lock is the only queue).
    const turns = outs.filter((o) => o.outcome !== null);
    expect(turns).toHaveLength(3);
    expect(turns.every((o) => o.outcome?.stopReason === "stop")).toBe(true);
    const childTurns = spans.filter((t) => t.session === child.id);
    expect(childTurns.length).toBeGreaterThanOrEqual(3);
    for (const [i, t] of childTurns.entries())
      if (i > 0) expect(t.from).toBeGreaterThan(childTurns[i - 1]?.to ?? 0);
    await service.close();
  });

  it("committing a workflow summary for a working child does not release its open call; the call returns after the turn (S004-050)", async () => {
    const gates = new Map<string, Promise<void>>();
    const hold = latch();
    gates.set("hold", hold.promise);
    const { service, repo } = makeService(db.pool, { tools: () => [gateTool("Gate", gates)] });
    const { account, parent } = await newParent(service);
    let returned = false;
    const call = service
      .delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: "working",
        task: scriptTask({ rounds: [[{ name: "Gate", arguments: { key: "hold" } }]], answer: "child done" }),
        mode: "foreground",
      })
      .then((r) => {
        returned = true;
        return r;
      });
    const childId = await waitFor(async () => {
      const run = await repo.runForToolCall(parent.id, "working", account.id);
      if (!run?.childSessionId) return undefined;
      const journal = await repo.readJournal(run.childSessionId, account.id);
      return journal.some((e) => e.body.type === "tool_intent") ? run.childSessionId : undefined;
    }, "the child's Gate call");
    const summaryId = await workflowFinished(
      service,
      { sessionId: childId, principalAccountId: account.id },
      "wf-in-child",
      "workflow summary for the child",
    );
    expect(await repo.queuedResultIds(childId, account.id)).toEqual([summaryId]);
    await new Promise((r) => setTimeout(r, 100));
    expect(returned).toBe(false);
    hold.open();
    const receipt = await call;
    expect(receipt).toMatchObject({ kind: "result", outcome: "ok" });
    // The summary joined the running turn at its tool round, once; the call answered after that turn.
    const journal = await repo.readJournal(childId, account.id);
    expect(resultIdsIn(journal)).toEqual([summaryId]);
    const summaryAt = journal.findIndex(
      (e) =>
        e.body.type === "message" &&
        e.body.message.role === "custom" &&
        e.body.message.details?.resultId === summaryId,
    );
    const lastAssistant = journal.findLastIndex(
      (e) => e.body.type === "message" && e.body.message.role === "assistant",
    );
    expect(summaryAt).toBeGreaterThan(0);
    expect(lastAssistant).toBeGreaterThan(summaryAt);
    expect(await repo.queuedResultIds(childId, account.id)).toEqual([]);
    await service.close();
  });

  it("no model input can name a dream: Delegate and a promoting DelegateContinue refuse a dream argument, and neither scope carries one (S004-567)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const [delegate] = delegationTools(service, parent, false);
    if (!delegate) throw new Error("expected the Delegate tool");
    const ctx = {
      sessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "dreamy",
      readOnly: false,
      workDir: null,
      signal: new AbortController().signal,
      progress: () => {},
    };
    await expect(
      delegate.execute({ task: "remember everything", dream: { runId: "r1", conversationId: "c1" } }, ctx),
    ).rejects.toBeInstanceOf(DelegationError);
    expect(await repo.runForToolCall(parent.id, "dreamy", account.id)).toBeNull();
    // The ordinary path mints the child's scope from live access alone: no dream marker in it.
    const out = await delegate.execute(
      { task: scriptTask({ answer: "plain" }) },
      { ...ctx, toolCallId: "plain" },
    );
    expect(out.content).toContain("plain");
    const run = await repo.runForToolCall(parent.id, "plain", account.id);
    const child = await repo.getSession(run?.childSessionId ?? "", account.id);
    expect(parseDelegatedExecutionScope(child.scope ?? "").dream).toBeUndefined();
    expect(child.scope).not.toContain("dream");
    // Promotion takes no dream from the model either, and mints the new scope from live access alone.
    const [, cont] = delegationTools(service, parent, false);
    if (!cont) throw new Error("expected the DelegateContinue tool");
    const promote = { sessionId: child.id, promote: true };
    await expect(
      cont.execute(
        { ...promote, text: "remember", dream: { runId: "r2", conversationId: "c2" } },
        { ...ctx, toolCallId: "dreamy-promote" },
      ),
    ).rejects.toBeInstanceOf(DelegationError);
    expect(await repo.runForToolCall(parent.id, "dreamy-promote", account.id)).toBeNull();
    await cont.execute({ ...promote, text: scriptTask({ answer: "promoted" }) }, { ...ctx, toolCallId: "p" });
    expect(await repo.runForToolCall(parent.id, "p", account.id)).toMatchObject({ status: "succeeded" });
    const promoted = (await repo.getSession(child.id, account.id)).scope ?? "";
    expect(parseDelegatedExecutionScope(promoted).dream).toBeUndefined();
    expect(promoted).not.toContain("dream");
    await service.close();
  });
});

describe("a workflow summary for a settling child", () => {
  it("starts the result turn itself, independently of the settlement drain, reporting to the open call's sink; the call is held until that turn finishes (S004-048 S004-058)", async () => {
    const gates = new Map<string, Promise<void>>();
    const helperGate = latch();
    gates.set("helper", helperGate.promise);
    const { service, repo } = makeService(db.pool, {
      tools: () => [gateTool("Gate", gates)],
      helperWaitMs: 5_000,
    });
    const { account, parent } = await newParent(service);
    let returned = false;
    const texts: string[] = [];
    // The child starts a background helper that keeps working, answers, and its call waits for the helper.
    const call = service
      .delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: "settling",
        task: scriptTask({
          rounds: [
            [
              {
                name: "Delegate",
                arguments: {
                  task: scriptTask({
                    rounds: [[{ name: "Gate", arguments: { key: "helper" } }]],
                    answer: "helper",
                  }),
                  background: true,
                },
              },
            ],
          ],
          answer: "child answered",
          followUp: "child took",
        }),
        mode: "foreground",
        progress: (e) => {
          if (e.type === "text") texts.push(e.text);
        },
      })
      .then((r) => {
        returned = true;
        return r;
      });
    const childId = await waitFor(async () => {
      const run = await repo.runForToolCall(parent.id, "settling", account.id);
      if (!run?.childSessionId) return undefined;
      const journal = await repo.readJournal(run.childSessionId, account.id);
      const answered = journal.some(
        (e) =>
          e.body.type === "message" &&
          e.body.message.role === "assistant" &&
          e.body.message.content.some((c) => c.type === "text" && c.text === "child answered"),
      );
      return answered && !service.turns.isBusy(run.childSessionId) ? run.childSessionId : undefined;
    }, "the child's answer, its call settling on a live helper");
    // What the workflow engine does when a workflow the child started ends: its summary row, then the hook.
    const summary = "workflow summary while settling";
    const { resultId: summaryId } = await repo.enqueueWorkflowSummary({
      resultId: randomUUID(),
      parentSessionId: childId,
      principalAccountId: account.id,
      toolCallId: "wf",
      outcome: "ok",
      body: summary,
      byteSize: Buffer.byteLength(summary),
    });
    await service.workflowSummaryQueued(childId, account.id, summaryId);
    // The summary's turn runs now, while the helper is still working (the settlement drain waits on it).
    await waitFor(async () => {
      const journal = await repo.readJournal(childId, account.id);
      const at = journal.findIndex(
        (e) =>
          e.body.type === "message" &&
          e.body.message.role === "custom" &&
          e.body.message.details?.resultId === summaryId,
      );
      return (
        at > 0 &&
        journal.slice(at).some((e) => e.body.type === "message" && e.body.message.role === "assistant")
      );
    }, "the summary's own turn");
    expect((await repo.openChildRuns(childId, account.id)).length).toBe(1);
    expect(returned).toBe(false);
    // Nobody handed the summary's turn a sink: the open call's own sink heard its answer.
    expect(texts).toEqual(["child answered", "child took (1)"]);
    helperGate.open();
    const receipt = await call;
    expect(receipt).toMatchObject({ kind: "result", outcome: "ok" });
    const journal = await repo.readJournal(childId, account.id);
    expect(resultIdsIn(journal).filter((id) => id === summaryId)).toHaveLength(1);
    await service.whenIdle();
    await service.close();
  });
});
