import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  createScriptedTurnRunner,
  DelegationError,
  type ProgressEvent,
  parseDelegatedExecutionScope,
  recoverDelegations,
  type SessionTurnRunner,
  type TurnRequest,
} from "../../src/index.js";
import { continueForeground, latch, makeService, newParent, scriptTask } from "./helpers.js";

const db = useTestDatabase();

/** The scripted runner, recording which model and read-only state every turn of every session ran on. */
function recordingRunner(block?: { model: string; gate: Promise<void>; entered: () => void }) {
  const scripted = createScriptedTurnRunner();
  const turns: { sessionId: string; model: string; readOnly: boolean }[] = [];
  const runner: SessionTurnRunner = {
    async runTurn(request: TurnRequest, host) {
      turns.push({ sessionId: request.sessionId, model: request.model, readOnly: request.readOnly });
      if (block && request.model === block.model) {
        block.entered();
        await Promise.race([block.gate, new Promise((r) => setTimeout(r, 15_000))]);
      }
      return scripted.runTurn(request, host);
    },
  };
  return { runner, turns };
}

async function childOf(service: ReturnType<typeof makeService>["service"], readOnly = false) {
  const { account, parent } = await newParent(service);
  const first = await service.delegate({
    parentSessionId: parent.id,
    principalAccountId: account.id,
    toolCallId: "d1",
    task: scriptTask({ answer: "first" }),
    mode: "foreground",
    ...(readOnly ? { readOnly: true } : {}),
  });
  if (first.kind !== "result") throw new Error("expected a result");
  return { account, parent, child: first.childSessionId };
}

describe("DelegateContinue's call id, onEvent, model and promote", () => {
  it("a continuation's model belongs to its call: its turns (and their recovery) run on it, the session keeps its own (S004-215 S004-208)", async () => {
    const gate = latch();
    const entered = latch();
    const rec = recordingRunner({ model: "scripted:blocked", gate: gate.promise, entered: entered.open });
    const { service, repo } = makeService(db.pool, { runner: rec.runner });
    await service.start();
    const { account, parent, child } = await childOf(service);
    const events: ProgressEvent[] = [];
    const other = await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: child,
      toolCallId: "c-model",
      text: scriptTask({ answer: "on the other model" }),
      mode: "foreground",
      model: "scripted:other",
      progress: (e) => events.push(e),
    });
    expect(other).toMatchObject({ kind: "result", body: "on the other model" });
    // The call id names the call's row; its model is stored there, not on the session.
    const row = await repo.runForToolCall(parent.id, "c-model", account.id);
    expect(row?.model).toBe("scripted:other");
    expect((await repo.getSession(child, account.id)).model).toBe("scripted");
    expect(rec.turns.filter((t) => t.sessionId === child).map((t) => t.model)).toEqual([
      "scripted",
      "scripted:other",
    ]);
    // onEvent saw the call's session identity and its activity.
    expect(events[0]).toMatchObject({ type: "session", sessionId: child });
    // Without a model, the next continuation runs on the session's own model again.
    await continueForeground(service, { parent, account }, child, "c-plain", scriptTask({ answer: "plain" }));
    expect(rec.turns.filter((t) => t.sessionId === child).at(-1)?.model).toBe("scripted");

    // A continuation on another model interrupted by a restart is recovered on that model.
    const started = await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: child,
      toolCallId: "c-blocked",
      text: scriptTask({ answer: "recovered on its model" }),
      mode: "background",
      model: "scripted:blocked",
    });
    expect(started.kind).toBe("started");
    await entered.promise;
    await service.pauseForRestart();
    gate.open();
    await service.close();
    const rec2 = recordingRunner();
    const second = makeService(db.pool, { runner: rec2.runner });
    const report = await recoverDelegations(second.service).finally(() => second.service.whenIdle());
    await second.service.close();
    expect(report.continued).toHaveLength(1);
    expect(rec2.turns.filter((t) => t.sessionId === child).map((t) => t.model)).toEqual(["scripted:blocked"]);
    const recovered = await repo.runForToolCall(parent.id, "c-blocked", account.id);
    expect(recovered?.status).toBe("succeeded");
  });

  it("a continuation's delivery and read-only clamp belong to its call: the next continuation has neither (S004-208)", async () => {
    const rec = recordingRunner();
    const { service, repo } = makeService(db.pool, { runner: rec.runner });
    const { account, parent, child } = await childOf(service);
    const started = await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: child,
      toolCallId: "c-bg",
      text: scriptTask({ answer: "in the background" }),
      mode: "background",
      callerReadOnly: true,
    });
    expect(started.kind).toBe("started");
    await service.whenIdle();
    const background = await repo.runForToolCall(parent.id, "c-bg", account.id);
    expect(background).toMatchObject({ mode: "background", status: "succeeded" });
    expect(background?.readOnlyScope).not.toBeNull();
    expect(await repo.resultForRun(background?.id as string, account.id)).toMatchObject({
      mode: "background",
      body: "in the background",
    });
    // the child's session took neither: a plain continuation is answered inline and runs writable
    const plain = await continueForeground(
      service,
      { parent, account },
      child,
      "c-fg",
      scriptTask({ answer: "inline" }),
    );
    expect(plain).toMatchObject({ kind: "result", body: "inline" });
    expect(await repo.runForToolCall(parent.id, "c-fg", account.id)).toMatchObject({
      mode: "foreground",
      readOnlyScope: null,
    });
    expect(rec.turns.filter((t) => t.sessionId === child).map((t) => t.readOnly)).toEqual([
      false,
      true,
      false,
    ]);
    const scope = parseDelegatedExecutionScope((await repo.getSession(child, account.id)).scope ?? "");
    expect(scope.readOnly).not.toBe(true);
    await service.close();
  });

  it("promote mints the child's scope again from the caller's live access; refused from a read-only turn (S004-215)", async () => {
    const rec = recordingRunner();
    const { service, repo } = makeService(db.pool, { runner: rec.runner });
    const { account, parent, child } = await childOf(service, true);
    const before = parseDelegatedExecutionScope((await repo.getSession(child, account.id)).scope ?? "");
    expect(before.readOnly).toBe(true);

    // From a read-only turn: refused before anything is written, and no event is emitted.
    const events: ProgressEvent[] = [];
    const refused = await service
      .continueSubagent({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        childSessionId: child,
        toolCallId: "p-ro",
        text: "go",
        mode: "foreground",
        callerReadOnly: true,
        promote: true,
        progress: (e) => events.push(e),
      })
      .catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(DelegationError);
    expect(refused).toMatchObject({ code: "write_access_refused" });
    expect(events).toEqual([]);
    expect(await repo.runForToolCall(parent.id, "p-ro", account.id)).toBeNull();

    const promoted = await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: child,
      toolCallId: "p-1",
      text: scriptTask({ answer: "promoted" }),
      mode: "foreground",
      promote: true,
    });
    expect(promoted).toMatchObject({ kind: "result", body: "promoted" });
    const after = parseDelegatedExecutionScope((await repo.getSession(child, account.id)).scope ?? "");
    expect(after.readOnly).toBe(false);
    expect(after.permissionBoundary).not.toBe("read-only");
    expect(after.accountId).toBe(before.accountId);
    expect(after.target).toEqual(before.target);
    expect(after.dream).toBeUndefined();
    // The promoted call ran writable.
    expect(rec.turns.filter((t) => t.sessionId === child).map((t) => t.readOnly)).toEqual([true, false]);
    await service.close();
  });

  it("a model change or a promotion never rides on a steer into a running call (S004-215)", async () => {
    const gate = latch();
    const entered = latch();
    const rec = recordingRunner({ model: "scripted:slow", gate: gate.promise, entered: entered.open });
    const { service } = makeService(db.pool, { runner: rec.runner });
    const { account, parent, child } = await childOf(service);
    await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: child,
      toolCallId: "busy",
      text: scriptTask({ answer: "slow" }),
      mode: "background",
      model: "scripted:slow",
    });
    await entered.promise;
    for (const extra of [{ model: "scripted:x" }, { promote: true }]) {
      await expect(
        service.continueSubagent({
          parentSessionId: parent.id,
          principalAccountId: account.id,
          childSessionId: child,
          toolCallId: `steer-${Object.keys(extra)[0]}`,
          text: "also this",
          mode: "foreground",
          ...extra,
        }),
      ).rejects.toMatchObject({ code: "wait_required" });
    }
    gate.open();
    await service.whenIdle();
    await service.close();
  });
});
