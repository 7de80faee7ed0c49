import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  createScriptedTurnRunner,
  DelegationError,
  type DelegationEvent,
  HostContractError,
  type OutputRecipient,
  type SessionTurnRunner,
} from "../../src/index.js";
import {
  delegateBackground,
  delegateCall,
  delegateForeground,
  gateTool,
  latch,
  makeService,
  newParent,
  queuedCall,
  recording,
  resultIdsIn,
  scriptTask,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

/** The scripted runner, with `hook.afterTurn` run (awaited) as each turn ends, before the turn returns. */
function afterEachTurn(hook: { afterTurn?: (sessionId: string) => Promise<void> }): SessionTurnRunner {
  const scripted = createScriptedTurnRunner();
  return {
    async runTurn(request, host) {
      const outcome = await scripted.runTurn(request, host);
      await hook.afterTurn?.(request.sessionId);
      return outcome;
    },
  };
}

async function steerRows(childSessionId: string) {
  const { rows } = await db.pool.query<{ status: string; drop_reason: string | null }>(
    "select status, drop_reason from delegated_steers where child_session_id = $1 order by created_at",
    [childSessionId],
  );
  return rows;
}

describe("a call's start, fenced by its generation", () => {
  it("a call whose child was discarded settles as an error naming that, without a turn", async () => {
    const { seen, runner } = recording();
    const { service, repo } = makeService(db.pool, { runner });
    const caller = await newParent(service);
    const run = await queuedCall(service, caller, "gone", scriptTask({ answer: "never" }));
    const resultId = await service.executeRun({ ...run, childSessionId: null });
    await service.whenIdle();
    expect(seen.filter((r) => r.sessionId === run.childSessionId)).toEqual([]);
    const settled = await repo.getRun(run.id, caller.account.id);
    expect(settled.status).toBe("failed");
    expect(settled.error).toEqual({
      code: "child_missing",
      message: "the child session was discarded before it was ready",
    });
    expect((await repo.getResult(resultId, caller.account.id)).body).toBe(
      "the child session was discarded before it was ready",
    );
  });

  it("a run no longer open in the caller's generation, with no result, is refused and runs nothing", async () => {
    const { seen, runner } = recording();
    const { service, repo } = makeService(db.pool, { runner });
    const caller = await newParent(service);
    const run = await queuedCall(service, caller, "moved", scriptTask({ answer: "never" }));
    const error = await service
      .executeRun({ ...run, generation: run.generation + 1 })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(DelegationError);
    expect(error).toMatchObject({
      code: "child_failed",
      message: "the call is no longer open in this generation",
      context: { runId: run.id },
    });
    expect(seen.filter((r) => r.sessionId === run.childSessionId)).toEqual([]);
    expect((await repo.getRun(run.id, caller.account.id)).status).toBe("queued");
  });

  it("running a settled call again answers its settled result and runs no second turn", async () => {
    const { seen, runner } = recording();
    const { service } = makeService(db.pool, { runner });
    const caller = await newParent(service);
    const run = await queuedCall(service, caller, "twice", scriptTask({ answer: "once only" }));
    const first = await service.executeRun(run);
    await service.whenIdle();
    const childTurns = () => seen.filter((r) => r.sessionId === run.childSessionId).length;
    expect(childTurns()).toBe(1);
    expect(await service.executeRun(run)).toBe(first);
    expect(childTurns()).toBe(1);
  });
});

describe("how a call settles", () => {
  it("a call stopped by its caller settles as aborted, and the follow-up it can no longer take is dropped", async () => {
    const stop = new AbortController();
    const hook: { afterTurn?: (sessionId: string) => Promise<void> } = {};
    const { service, repo } = makeService(db.pool, { runner: afterEachTurn(hook) });
    const caller = await newParent(service);
    const run = await queuedCall(service, caller, "stopped", scriptTask({ answer: "partial" }));
    const childId = run.childSessionId ?? "";
    // The caller goes away as the child's first turn ends; a follow-up arrived meanwhile.
    hook.afterTurn = async (sessionId) => {
      if (sessionId !== childId || stop.signal.aborted) return;
      await repo.enqueueSteer(childId, caller.account.id, "one more thing");
      stop.abort();
    };
    const resultId = await service.executeRun(run, { signal: stop.signal });
    await service.whenIdle();
    const settled = await repo.getRun(run.id, caller.account.id);
    expect(settled.status).toBe("failed");
    expect(settled.error).toEqual({ code: "aborted", message: "the call was stopped" });
    expect((await repo.getResult(resultId, caller.account.id)).body).toBe("the call was stopped");
    expect(await steerRows(childId)).toEqual([
      { status: "dropped", drop_reason: "the call ended: the call was stopped" },
    ]);
  });

  it("a call stopped while it waits out a live helper settles at once as aborted, the helper still running", async () => {
    const stop = new AbortController();
    const gates = new Map<string, Promise<void>>();
    const helperGate = latch();
    gates.set("helper", helperGate.promise);
    const { service, repo } = makeService(db.pool, { tools: () => [gateTool("Gate", gates)] });
    const caller = await newParent(service);
    const run = await queuedCall(
      service,
      caller,
      "waiting",
      scriptTask({
        rounds: [
          [
            delegateCall(
              { rounds: [[{ name: "Gate", arguments: { key: "helper" } }]], answer: "helper done" },
              { background: true },
            ),
          ],
        ],
        answer: "C waits",
      }),
    );
    const childId = run.childSessionId ?? "";
    const settled = service.executeRun(run, { signal: stop.signal });
    await waitFor(async () => {
      const open = await repo.openChildRuns(childId, caller.account.id);
      const answered = (await repo.readJournal(childId, caller.account.id)).some(
        (e) =>
          e.body.type === "message" &&
          e.body.message.role === "assistant" &&
          e.body.message.content.some((c) => c.type === "text" && c.text === "C waits"),
      );
      return open.length === 1 && answered && !service.turns.isBusy(childId);
    }, "the call waiting on its live helper");
    stop.abort();
    const resultId = await waitFor(
      () => Promise.race([settled, new Promise<undefined>((r) => setTimeout(() => r(undefined), 100))]),
      "the stopped call to settle",
      5_000,
    );
    expect((await repo.getRun(run.id, caller.account.id)).error).toEqual({
      code: "aborted",
      message: "the call was stopped",
    });
    expect((await repo.getResult(resultId, caller.account.id)).outcome).toBe("error");
    expect(await repo.openChildRuns(childId, caller.account.id)).toHaveLength(1);
    helperGate.open();
    await service.whenIdle();
  });

  it("a follow-up that arrives while the result is being published gets the settled notice", async () => {
    const { service, repo } = makeService(db.pool, {
      completionEmitter: async (c) => {
        await repo.enqueueSteer(c.childSessionId ?? "", c.principalAccountId, "too late");
      },
    });
    const caller = await newParent(service);
    const receipt = await delegateBackground(service, caller, "late", scriptTask({ answer: "finished" }));
    if (receipt.kind !== "started") throw new Error("expected a background call");
    await waitFor(
      async () => (await repo.getRun(receipt.runId, caller.account.id)).status === "succeeded",
      "the call to settle",
    );
    await service.whenIdle();
    expect(await steerRows(receipt.childSessionId)).toEqual([
      { status: "dropped", drop_reason: "the call settled before this follow-up was taken" },
    ]);
  });

  it("a completion reported as an error without a code settles with child_failed and the body as message", async () => {
    const { service, repo } = makeService(db.pool);
    const caller = await newParent(service);
    const run = await queuedCall(service, caller, "reported", scriptTask({ answer: "unused" }));
    const resultId = await service.emitDelegationCompletion({
      kind: "subagent",
      runId: run.id,
      principalAccountId: caller.account.id,
      outcome: "error",
      body: "the runner gave up",
    });
    await service.whenIdle();
    const settled = await repo.getRun(run.id, caller.account.id);
    expect(settled.status).toBe("failed");
    expect(settled.error).toEqual({ code: "child_failed", message: "the runner gave up" });
    expect(await repo.settledResultIds(caller.parent.id, caller.account.id)).toContain(resultId);
  });
});

describe("a result's inline-byte limit", () => {
  it("a body of exactly the limit stays inline and never asks for the recipient's writer; one byte more is spilled through it (S004-237)", async () => {
    const captured: OutputRecipient[] = [];
    const { service, repo } = makeService(db.pool, {
      toolResultInlineBytes: () => 32,
      captureOutputWriter: async (recipient) => {
        captured.push(recipient);
        throw new Error("not wanted");
      },
    });
    const caller = await newParent(service);
    const body = "x".repeat(32);
    const receipt = await delegateForeground(service, caller, "exact", scriptTask({ answer: body }));
    expect(receipt).toMatchObject({ kind: "result", outcome: "ok", body });
    expect(captured).toEqual([]);
    const result = await repo.getResult(receipt.kind === "result" ? receipt.resultId : "", caller.account.id);
    expect(result.spillPath).toBeNull();
    // One byte more is spilled through the recipient's writer (here: refused, a typed error).
    const over = await delegateForeground(service, caller, "over", scriptTask({ answer: `${body}y` })).catch(
      (e: unknown) => e,
    );
    expect(over).toMatchObject({ contract: "output_writer" });
    expect(captured).toEqual([{ sessionId: caller.parent.id, principalAccountId: caller.account.id }]);
  });

  it("a limit the host fails to give is a typed error naming that contract; nothing is settled", async () => {
    const { service, repo } = makeService(db.pool, {
      toolResultInlineBytes: () => {
        throw new Error("no limit today");
      },
    });
    const caller = await newParent(service);
    const error = await delegateForeground(service, caller, "nolimit", scriptTask({ answer: "a" })).catch(
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(HostContractError);
    expect(error).toMatchObject({ contract: "tool_result_inline_bytes" });
    const run = await repo.runForToolCall(caller.parent.id, "nolimit", caller.account.id);
    expect(run?.status).toBe("settling");
  });
});

describe("how a settled result reaches its parent", () => {
  it("a foreground call from a streaming parent is its tool result: the parent's inbox is not woken for it", async () => {
    const events: DelegationEvent[] = [];
    const { service, repo } = makeService(db.pool, { onEvent: (e) => events.push(e) });
    const { account, parent } = await newParent(service);
    await service.prompt(
      parent.id,
      account.id,
      scriptTask({ rounds: [[delegateCall({ answer: "fg answer" })]], answer: "parent done" }),
    );
    await service.whenIdle();
    const ids = await repo.settledResultIds(parent.id, account.id);
    expect(ids).toHaveLength(1);
    expect(events.filter((e) => e.type === "delegation.result_steered")).toEqual([]);
    expect(resultIdsIn(await repo.readJournal(parent.id, account.id))).toEqual(ids);
  });

  it("a background call's result wakes the parent's inbox even while the parent streams", async () => {
    const events: DelegationEvent[] = [];
    const { service, repo } = makeService(db.pool, { onEvent: (e) => events.push(e) });
    const { account, parent } = await newParent(service);
    await service.prompt(
      parent.id,
      account.id,
      scriptTask({ rounds: [[delegateCall({ answer: "bg answer" }, { background: true })]], answer: "done" }),
    );
    await waitFor(async () => (await repo.settledResultIds(parent.id, account.id)).length === 1, "delivered");
    await service.whenIdle();
    const ids = await repo.settledResultIds(parent.id, account.id);
    expect(events.filter((e) => e.type === "delegation.result_steered")).toEqual([
      { type: "delegation.result_steered", parentSessionId: parent.id, resultId: ids[0] },
    ]);
  });

  it("a foreground call moved to the background (Ctrl+B) while its parent streams wakes the parent's inbox", async () => {
    const gates = new Map<string, Promise<void>>();
    const childGate = latch();
    const parentGate = latch();
    gates.set("child", childGate.promise);
    gates.set("parent", parentGate.promise);
    const events: DelegationEvent[] = [];
    const { service, repo } = makeService(db.pool, {
      tools: () => [gateTool("Gate", gates)],
      onEvent: (e) => events.push(e),
    });
    const { account, parent } = await newParent(service);
    const turn = service.prompt(
      parent.id,
      account.id,
      scriptTask({
        rounds: [
          [delegateCall({ rounds: [[{ name: "Gate", arguments: { key: "child" } }]], answer: "child done" })],
          [{ name: "Gate", arguments: { key: "parent" } }],
        ],
        answer: "parent done",
      }),
    );
    const intents = async (sessionId: string) =>
      (await repo.readJournal(sessionId, account.id)).filter((e) => e.body.type === "tool_intent").length;
    const run = await waitFor(async () => {
      const { rows } = await db.pool.query<{ id: string; child_session_id: string }>(
        "select id, child_session_id from subagent_runs where parent_session_id = $1",
        [parent.id],
      );
      const row = rows[0];
      return row && (await intents(row.child_session_id)) === 1 ? row : undefined;
    }, "the child at its gate");
    expect(await service.moveToBackground(run.id, account.id)).toEqual({ ok: true });
    // the parent goes on streaming: its next tool round waits at its own gate
    await waitFor(async () => (await intents(parent.id)) === 2, "the parent at its gate");
    childGate.open();
    await waitFor(
      async () => (await repo.getRun(run.id, account.id)).status === "succeeded",
      "the call to settle",
    );
    const [resultId] = await waitFor(async () => {
      const all = [
        ...(await repo.settledResultIds(parent.id, account.id)),
        ...(await repo.queuedResultIds(parent.id, account.id)),
      ];
      return all.length === 1 ? all : undefined;
    }, "the result in the parent's inbox");
    expect(events.filter((e) => e.type === "delegation.result_steered")).toEqual([
      { type: "delegation.result_steered", parentSessionId: parent.id, resultId },
    ]);
    parentGate.open();
    await turn;
    await service.whenIdle();
    expect(
      resultIdsIn(await repo.readJournal(parent.id, account.id)).filter((id) => id === resultId),
    ).toHaveLength(1);
  });
});
