import { readFileSync } from "node:fs";
import type { TranscriptMessage } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import {
  createScriptedTurnRunner,
  type DelegationEvent,
  type DelegationService,
  type SessionTurnRunner,
} from "../../src/index.js";
import {
  type Caller,
  delegateBackground,
  delegateCall,
  delegateForeground,
  gateTool,
  latch,
  makeService,
  messages,
  newParent,
  resultIdsIn,
  scriptTask,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

/** Emits the whole-workflow summary of `caller`'s workflow call wf-1, ended ok. */
function emitWorkflowSummary(service: DelegationService, { parent, account }: Caller, summary: string) {
  return service.emitDelegationCompletion({
    kind: "workflow_summary",
    parentSessionId: parent.id,
    principalAccountId: account.id,
    toolCallId: "wf-1",
    outcome: "ok",
    summary,
  });
}

describe("delivery of delegated results", () => {
  it("a foreground result is the parent's toolResult, appended and acknowledged together (S004-025)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const outcome = await service.prompt(
      parent.id,
      account.id,
      scriptTask({ rounds: [[delegateCall({ answer: "  child says hi\n" })]], answer: "parent done" }),
    );
    expect(outcome.stopReason).toBe("stop");
    await service.whenIdle();
    const journal = await repo.readJournal(parent.id, account.id);
    const toolResult = messages(journal).find((m) => m.role === "toolResult");
    expect(toolResult).toMatchObject({ toolName: "Delegate", content: "  child says hi\n", isError: false });
    const ids = await repo.settledResultIds(parent.id, account.id);
    expect(ids).toHaveLength(1);
    expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([]);
    // the acknowledgement names the very journal row that carries the result's id
    const entry = journal.find((e) => e.body.type === "message" && e.body.message.role === "toolResult");
    expect(
      entry?.body.type === "message" &&
        entry.body.message.role === "toolResult" &&
        entry.body.message.details,
    ).toMatchObject({ resultId: ids[0] });
    const ack = await db.pool.query<{ journal_seq: string }>(
      "select journal_seq from delegation_result_acks where result_id = $1",
      [ids[0]],
    );
    expect(ack.rows.map((r) => Number(r.journal_seq))).toEqual([entry?.seq]);
    expect(messages(journal).at(-1)).toMatchObject({
      role: "assistant",
      content: [{ type: "text", text: "parent done" }],
    });
  });

  it("an idle parent gets its queued results in one batched follow-up turn, started by the next result (S004-029)", async () => {
    const gates = new Map<string, Promise<void>>();
    const { service, repo } = makeService(db.pool, { tools: () => [gateTool("Gate", gates)] });
    const { account, parent } = await newParent(service);
    await service.prompt(parent.id, account.id, scriptTask({ answer: "ready" }));
    // what follows the first turn up (its look at the inbox) has ended before the lock is taken
    await service.whenIdle();
    const hold = latch();
    // The parent is busy (its turn lock held) while three results settle; then it goes idle.
    const busy = service.turns.exclusive(parent.id, () => hold.promise);
    for (let i = 0; i < 3; i++) {
      await delegateBackground(service, { parent, account }, `bg-${i}`, scriptTask({ answer: `r${i}` }));
    }
    await waitFor(
      async () => (await repo.queuedResultIds(parent.id, account.id)).length === 3,
      "three queued",
    );
    hold.open();
    await busy;
    // Nothing follows the released lock up: the fourth result, entering the idle parent's inbox, does.
    expect(await repo.queuedResultIds(parent.id, account.id)).toHaveLength(3);
    await delegateBackground(service, { parent, account }, "bg-3", scriptTask({ answer: "r3" }));
    await waitFor(async () => (await repo.settledResultIds(parent.id, account.id)).length === 4, "delivered");
    await service.whenIdle();
    const msgs = messages(await repo.readJournal(parent.id, account.id));
    const firstResult = msgs.findIndex((m) => m.role === "custom");
    expect(msgs.slice(firstResult, firstResult + 4).every((m) => m.role === "custom")).toBe(true);
    expect(msgs.slice(firstResult + 4)).toEqual([
      { role: "assistant", content: [{ type: "text", text: "noted (4)" }], stopReason: "stop" },
    ]);
  });

  it("delivery is exactly once when many children settle at once into one parent, streaming and idle", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const n = 24;
    // Half are delegated by the parent's own streaming turn, half straight into the idle parent.
    const turn = service.prompt(
      parent.id,
      account.id,
      scriptTask({
        rounds: [
          Array.from({ length: n / 2 }, (_, i) => delegateCall({ answer: `s${i}` }, { background: true })),
        ],
        answer: "delegated",
      }),
    );
    await Promise.all(
      Array.from({ length: n / 2 }, (_, i) =>
        delegateBackground(service, { parent, account }, `idle-${i}`, scriptTask({ answer: `i${i}` })),
      ),
    );
    await turn;
    await waitFor(async () => {
      const open = await db.pool.query(
        "select 1 from subagent_runs where status in ('queued','running','settling')",
      );
      const queued = await repo.queuedResultIds(parent.id, account.id);
      return open.rowCount === 0 && queued.length === 0;
    }, "all delivered");
    await service.whenIdle();
    const journal = await repo.readJournal(parent.id, account.id);
    const ids = resultIdsIn(journal);
    expect(ids).toHaveLength(n);
    expect(new Set(ids).size).toBe(n);
    const all = await db.pool.query<{ id: string }>(
      "select id from delegation_results where parent_session_id = $1",
      [parent.id],
    );
    expect(new Set(ids)).toEqual(new Set(all.rows.map((r) => r.id)));
    expect((await repo.settledResultIds(parent.id, account.id)).sort()).toEqual([...ids].sort());
  });

  it("a failed parent answer does not requeue an already durable result (S004-033 S004-051)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    // The follow-up request (the 2nd of this plan) fails at the provider.
    await service.prompt(parent.id, account.id, scriptTask({ answer: "waiting", failAtRequest: 1 }));
    await delegateBackground(service, { parent, account }, "bg", scriptTask({ answer: "the result" }));
    await waitFor(async () => {
      const msgs = messages(await repo.readJournal(parent.id, account.id));
      return msgs.some((m) => m.role === "assistant" && m.stopReason === "error");
    }, "failed follow-up");
    await service.whenIdle();
    expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([]);
    expect(await repo.settledResultIds(parent.id, account.id)).toHaveLength(1);
  });

  it("onResultDelivered publishes after the commit, with the committed result ids (S004-026)", async () => {
    const seen: Array<{ parent: string; ids: string[]; durable: number }> = [];
    const { service, repo } = makeService(db.pool, {
      onResultDelivered: async (e) => {
        const account = (
          await db.pool.query<{ principal_account_id: string }>(
            "select principal_account_id from sessions where id = $1",
            [e.parentSessionId],
          )
        ).rows[0];
        const durable = await repo.settledResultIds(e.parentSessionId, account?.principal_account_id ?? "");
        seen.push({
          parent: e.parentSessionId,
          ids: e.delivered.map((d) => d.resultId),
          durable: durable.length,
        });
      },
    });
    const { account, parent } = await newParent(service);
    await service.prompt(parent.id, account.id, scriptTask({ answer: "ok" }));
    const r = await delegateBackground(service, { parent, account }, "bg", scriptTask({ answer: "x" }));
    await waitFor(async () => seen.length > 0, "publication");
    await service.whenIdle();
    expect(r.kind).toBe("started");
    expect(seen[0]?.parent).toBe(parent.id);
    expect(seen[0]?.ids).toEqual(await repo.settledResultIds(parent.id, account.id));
    expect(seen[0]?.durable).toBe(1);
  });

  it("each newly queued result emits delegation.result_steered once, for a root parent and for a nested (child) parent alike (S004-072)", async () => {
    const events: DelegationEvent[] = [];
    const { service, repo } = makeService(db.pool, { onEvent: (e) => events.push(e) });
    const { account, parent } = await newParent(service);
    await service.prompt(
      parent.id,
      account.id,
      scriptTask({
        rounds: [
          [
            delegateCall({ answer: "a" }, { background: true }),
            delegateCall({ answer: "b" }, { background: true }),
            // a child that is itself a parent: its helper's result is queued for the child
            delegateCall({ rounds: [[delegateCall({ answer: "h" }, { background: true })]], answer: "c" }),
          ],
        ],
      }),
    );
    const nested = (
      await db.pool.query<{ child_session_id: string }>(
        "select child_session_id from subagent_runs where parent_session_id = $1 and mode = 'foreground'",
        [parent.id],
      )
    ).rows[0]?.child_session_id;
    if (!nested) throw new Error("expected the nested parent");
    const queuedFor = async (session: string) =>
      (
        await db.pool.query<{ id: string }>(
          "select id from delegation_results where parent_session_id = $1 and mode = 'background'",
          [session],
        )
      ).rows.map((r) => r.id);
    await waitFor(
      async () => (await queuedFor(parent.id)).length === 2 && (await queuedFor(nested)).length === 1,
      "three background results",
    );
    await service.whenIdle();
    const steered = (session: string) =>
      events
        .filter((e) => e.type === "delegation.result_steered" && e.parentSessionId === session)
        .map((e) => (e.type === "delegation.result_steered" ? e.resultId : ""))
        .sort();
    expect(steered(parent.id)).toEqual((await queuedFor(parent.id)).sort());
    expect(steered(nested)).toEqual(await queuedFor(nested));
    expect(events.filter((e) => e.type === "delegation.result_steered")).toHaveLength(3);
    expect(await repo.queuedResultIds(nested, account.id)).toEqual([]);
  });

  it("a background child's result and a workflow summary are both prepared (spilled) before they enter the inbox", async () => {
    const { service, repo } = makeService(db.pool, { toolResultInlineBytes: () => 64 });
    const { account, parent } = await newParent(service);
    const answer = `child finished: ${"line ok; ".repeat(20)}`;
    await service.prompt(
      parent.id,
      account.id,
      scriptTask({ rounds: [[delegateCall({ answer }, { background: true })]], answer: "started" }),
    );
    await service.whenIdle();
    const summary = `workflow finished: ${"node ok; ".repeat(20)}`;
    await emitWorkflowSummary(service, { parent, account }, summary);
    await waitFor(
      async () => (await repo.settledResultIds(parent.id, account.id)).length === 2,
      "both delivered",
    );
    await service.whenIdle();
    const ids = await repo.settledResultIds(parent.id, account.id);
    const full = [answer, summary];
    for (const [i, id] of ids.entries()) {
      // the inbox row holds the prepared placeholder, never the raw body: it was prepared before the handoff
      const row = await repo.getResult(id, account.id);
      expect(row.body).toMatch(/^\[full result: \d+ bytes at (\S+); read that path with Read\]/);
      const path = /at (\S+); read/.exec(row.body)?.[1] ?? "";
      expect(readFileSync(path, "utf8")).toBe(full[i]);
    }
  });

  it("emitDelegationCompletion delivers one whole-workflow summary per call, prepared like a child result before the inbox", async () => {
    const { service, repo } = makeService(db.pool, { toolResultInlineBytes: () => 64 });
    const { account, parent } = await newParent(service);
    await service.prompt(parent.id, account.id, scriptTask({ answer: "started a workflow" }));
    const summary = `workflow finished: ${"node ok; ".repeat(20)}`;
    const emit = () => emitWorkflowSummary(service, { parent, account }, summary);
    const [a, b] = await Promise.all([emit(), emit()]);
    expect(a).toBe(b);
    await waitFor(
      async () => (await repo.settledResultIds(parent.id, account.id)).length === 1,
      "summary delivered",
    );
    await service.whenIdle();
    const delivered = messages(await repo.readJournal(parent.id, account.id)).filter(
      (m) => m.role === "custom",
    );
    expect(delivered).toHaveLength(1);
    expect(delivered[0]?.content).toMatch(/^\[workflow summary for call wf-1: ok\]/);
    expect(delivered[0]?.role === "custom" && delivered[0].details?.spillPath).toBeTruthy();
    expect(await repo.settledResultIds(parent.id, account.id)).toEqual([a]);
  });

  it("a retried Delegate tool call returns the first call's result and never runs a second child", async () => {
    const { service } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const call = () =>
      delegateForeground(service, { parent, account }, "same", scriptTask({ answer: "once" }));
    const first = await call();
    await service.whenIdle();
    const again = await call();
    expect(again).toEqual(first);
    const runs = await db.pool.query("select 1 from subagent_runs where parent_session_id = $1", [parent.id]);
    expect(runs.rowCount).toBe(1);
  });
});

/**
 * A streaming parent delegates six children in the background in one tool round, then runs a tool (Gate)
 * that lasts until all six results have settled. Each child waits at a gate of its own, opened one at a
 * time in an order unlike the order of delegation, so the results settle in that order.
 */
describe("a streaming parent receiving results", () => {
  const settleOrder = [3, 0, 5, 1, 4, 2];
  let msgs: ReturnType<typeof messages>;
  let fifo: string[];
  /** What each steering drain handed the parent's running turn, in order. */
  const steered: TranscriptMessage[] = [];
  beforeAll(async () => {
    const gates = new Map<string, Promise<void>>();
    let parentId = "";
    const scripted = createScriptedTurnRunner();
    const runner: SessionTurnRunner = {
      runTurn: (request, host) =>
        scripted.runTurn(
          request,
          request.sessionId !== parentId
            ? host
            : {
                ...host,
                drainSteering: async () => {
                  const drained = await host.drainSteering();
                  steered.push(...drained);
                  return drained;
                },
              },
        ),
    };
    const { service, repo } = makeService(db.pool, { runner, tools: () => [gateTool("Gate", gates)] });
    const { account, parent } = await newParent(service);
    parentId = parent.id;
    const n = 6;
    const queuedAll = latch();
    gates.set("parent", queuedAll.promise);
    const childGates = Array.from({ length: n }, (_, i) => {
      const gate = latch();
      gates.set(`child ${i}`, gate.promise);
      return gate;
    });
    const run = service.prompt(
      parent.id,
      account.id,
      scriptTask({
        rounds: [
          Array.from({ length: n }, (_, i) =>
            delegateCall(
              { rounds: [[{ name: "Gate", arguments: { key: `child ${i}` } }]], answer: `ANSWER-${i}` },
              { background: true },
            ),
          ),
          [{ name: "Gate", arguments: { key: "parent" } }],
        ],
        answer: "all in",
      }),
    );
    const fifoOrder = async () =>
      (
        await db.pool.query<{ id: string }>(
          "select id from delegation_results where parent_session_id = $1 order by queue_seq",
          [parent.id],
        )
      ).rows.map((r) => r.id);
    for (const [settled, i] of settleOrder.entries()) {
      childGates[i]?.open();
      await waitFor(async () => (await fifoOrder()).length === settled + 1, `child ${i} settled`);
    }
    queuedAll.open();
    await run;
    await service.whenIdle();
    msgs = messages(await repo.readJournal(parent.id, account.id));
    fifo = await fifoOrder();
  });

  it("its running turn is steered every result in the order the results settled, not the order they were delegated (S004-027)", () => {
    const answerOf = (m: TranscriptMessage) => /ANSWER-\d/.exec(String(m.content))?.[0];
    expect(steered.map(answerOf)).toEqual(settleOrder.map((i) => `ANSWER-${i}`));
    // The parent's journal keeps them in the same order, the inbox's own.
    const delivered = msgs.filter((m) => m.role === "custom");
    expect(delivered.map((m) => m.details?.resultId)).toEqual(fifo);
    expect(delivered.map(answerOf)).toEqual(steered.map(answerOf));
  });

  it("gets results only after a tool round and before its next provider request (S004-028)", () => {
    for (const [i, m] of msgs.entries()) {
      if (m.role !== "custom") continue;
      expect(["toolResult", "custom"]).toContain(msgs[i - 1]?.role);
      // the next message after a run of results is the model's next step
      const next = msgs.slice(i + 1).find((x) => x.role !== "custom");
      expect(next?.role).toBe("assistant");
    }
    expect(msgs.at(-1)).toMatchObject({ role: "assistant", content: [{ type: "text", text: "all in" }] });
  });

  it("a parent that took its results in its running turn needs no new turn: its own answer is the last word, nothing waits (S004-029)", async () => {
    expect(msgs.filter((m) => m.role === "custom")).toHaveLength(6);
    const lastResult = msgs.findLastIndex((m) => m.role === "custom");
    expect(msgs.slice(lastResult + 1).filter((m) => m.role === "assistant")).toEqual([
      { role: "assistant", content: [{ type: "text", text: "all in" }], stopReason: "stop" },
    ]);
    expect(msgs.some((m) => m.role === "assistant" && JSON.stringify(m.content).includes("noted"))).toBe(
      false,
    );
  });

  it("reading the queue adds no provider request: one per tool round and the answer (S004-070)", () => {
    expect(msgs.filter((m) => m.role === "assistant")).toHaveLength(3);
  });

  it("a tool running while results arrive is not cut short: it ends with its own result, none in between (S004-071)", () => {
    const call = msgs.findIndex(
      (m) => m.role === "assistant" && m.content.some((c) => c.type === "toolCall" && c.name === "Gate"),
    );
    const result = msgs.findIndex((m) => m.role === "toolResult" && m.toolName === "Gate");
    expect(call).toBeGreaterThanOrEqual(0);
    expect(result).toBe(call + 1);
    expect(msgs[result]).toMatchObject({ content: "gate parent open", isError: false });
  });
});
