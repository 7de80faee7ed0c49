import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { canonicalJson, parseDelegatedExecutionScope, recoverDelegations } from "../../src/index.js";
import {
  continueForeground,
  delegateForeground,
  gatedHelperTask,
  interruptedContinuation,
  makeService,
  messages,
  newParent,
  recording,
  scriptTask,
  serviceWithGate,
  waitFor,
  writeTask,
  writeTool,
} from "./helpers.js";

const db = useTestDatabase();

const storedScopeText = async (id: string) =>
  (await db.pool.query<{ scope: string }>("select scope from sessions where id = $1", [id])).rows[0]?.scope;

describe("one request for every path of a delegated call", () => {
  it("foreground, background, continuation, helper wake and recovery turns get the same request from the durable scope (S004-206)", async () => {
    // The helper answers only once the child's own turn has ended: its result then wakes the settling child
    // in a turn of its own (answering at once, it could be taken at the child's tool round instead).
    const { service, repo, seen, gate: helperGate } = serviceWithGate(db.pool, "helper");
    const { account, parent } = await newParent(service);
    // Foreground call whose child starts a background helper: the helper's result wakes the settling child.
    const call = service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "fg",
      task: gatedHelperTask("helper", "helper done", { answer: "child done" }),
      mode: "foreground",
      tools: { deny: ["Write(/etc/**)"] },
    });
    await waitFor(async () => {
      const { rows } = await db.pool.query<{ id: string }>(
        "select child_session_id as id from subagent_runs where parent_session_id = $1 and tool_call_id = 'fg'",
        [parent.id],
      );
      const id = rows[0]?.id;
      if (!id) return false;
      return messages(await repo.readJournal(id, account.id)).some(
        (m) => m.role === "assistant" && m.content.some((c) => c.type === "text" && c.text === "child done"),
      );
    }, "the child's own turn to end");
    helperGate.open();
    const first = await call;
    if (first.kind !== "result") throw new Error("expected a result");
    const child = first.childSessionId;
    await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: child,
      toolCallId: "bg",
      text: scriptTask({ answer: "background continuation" }),
      mode: "background",
    });
    await waitFor(
      async () => (await repo.runForToolCall(parent.id, "bg", account.id))?.status === "succeeded",
      "the background continuation",
    );
    // A call interrupted by a restart (its owner is gone): recovery continues it.
    const run = await interruptedContinuation(
      service,
      { parent, account },
      child,
      "rec",
      scriptTask({ answer: "recovered" }),
    );
    await recoverDelegations(service);
    await waitFor(async () => (await repo.getRun(run.id, account.id)).status === "succeeded", "recovery");
    await service.whenIdle();

    const childTurns = seen.filter((r) => r.sessionId === child);
    // The first turn, the helper wake while settling, the background continuation, the recovered call.
    expect(childTurns.length).toBeGreaterThanOrEqual(4);
    const journal = messages(await repo.readJournal(child, account.id));
    expect(journal.some((m) => m.role === "custom" && m.content.includes("helper done"))).toBe(true);
    const expected = canonicalJson(parseDelegatedExecutionScope((await storedScopeText(child)) ?? ""));
    for (const request of childTurns) {
      expect(request.scope && canonicalJson(request.scope)).toBe(expected);
      expect(request.readOnly).toBe(false);
      expect(request.workDir).toBeNull();
      expect(request.identity).toEqual({ principalAccountId: account.id });
      expect(request.systemPrompt).toBe(childTurns[0]?.systemPrompt);
      expect(request.tools.map((t) => t.name)).toEqual(childTurns[0]?.tools.map((t) => t.name));
    }
    await service.close();
  });

  it("current account denials and the caller's own narrow a turn without changing the durable scope (S004-207)", async () => {
    const { seen, runner } = recording();
    const { service, repo } = makeService(db.pool, { runner, tools: () => [writeTool] });
    const { account, parent } = await newParent(service);
    const first = await delegateForeground(service, { parent, account }, "d", writeTask("wrote"));
    if (first.kind !== "result") throw new Error("expected a result");
    const before = await storedScopeText(first.childSessionId);
    await db.pool.query("update accounts set tool_deny = '{Write}' where id = $1", [account.id]);
    await continueForeground(service, { parent, account }, first.childSessionId, "c", writeTask("tried"));
    const writes = messages(await repo.readJournal(first.childSessionId, account.id)).flatMap((m) =>
      m.role === "toolResult" && m.toolName === "Write" ? [m.isError] : [],
    );
    expect(writes).toEqual([false, true]);
    const turns = seen.filter((r) => r.sessionId === first.childSessionId);
    expect(turns[0]?.scope?.tools.deny).not.toContain("Write");
    expect(turns[1]?.scope?.tools.deny).toContain("Write");
    // The durable scope is byte for byte what was captured.
    expect(await storedScopeText(first.childSessionId)).toBe(before);
    // Lifting the denial lifts the narrowing: the stored scope never absorbed it.
    await db.pool.query("update accounts set tool_deny = '{}' where id = $1", [account.id]);
    await continueForeground(
      service,
      { parent, account },
      first.childSessionId,
      "c2",
      writeTask("wrote again"),
    );
    const again = messages(await repo.readJournal(first.childSessionId, account.id)).flatMap((m) =>
      m.role === "toolResult" && m.toolName === "Write" ? [m.isError] : [],
    );
    expect(again).toEqual([false, true, false]);
    // The caller's own denial (a read-only DelegateContinue) narrows its turn alone, the same way.
    await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: first.childSessionId,
      toolCallId: "c3",
      text: writeTask("tried read-only"),
      mode: "foreground",
      callerReadOnly: true,
    });
    await continueForeground(service, { parent, account }, first.childSessionId, "c4", writeTask("wrote"));
    const last = messages(await repo.readJournal(first.childSessionId, account.id)).flatMap((m) =>
      m.role === "toolResult" && m.toolName === "Write" ? [m.isError] : [],
    );
    expect(last).toEqual([false, true, false, true, false]);
    const readOnly = seen.filter((r) => r.sessionId === first.childSessionId).map((r) => r.readOnly);
    expect(readOnly).toEqual([false, false, false, true, false]);
    expect(await storedScopeText(first.childSessionId)).toBe(before);
    await service.close();
  });

  it("Delegate and dreaming supply the authenticated account, permission boundary and project target to the capture", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service, { isOwner: true });
    const plain = await delegateForeground(service, { parent, account }, "d", scriptTask({ answer: "ok" }));
    const readOnly = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "r",
      task: scriptTask({ answer: "ok" }),
      mode: "foreground",
      callerReadOnly: true,
    });
    const dream = await service.startDream({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      dreamRunId: "dream-191",
      task: scriptTask({ answer: "dreamt" }),
    });
    const scopes = await Promise.all(
      [plain, readOnly, dream].map(async (r) => {
        if (r.kind === "steered") throw new Error("unexpected");
        return parseDelegatedExecutionScope(
          (await repo.getSession(r.childSessionId, account.id)).scope ?? "",
        );
      }),
    );
    for (const s of scopes) {
      expect(s.accountId).toBe(account.id);
      expect(s.target).toEqual({ kind: "host", ref: null });
    }
    expect(scopes.map((s) => s.permissionBoundary)).toEqual(["workspace-write", "read-only", "read-only"]);
    expect(scopes[0]?.operator).toBe(true);
    expect(scopes[2]?.operator).toBe(false);
    await service.whenIdle();
    await service.close();
  });
});
