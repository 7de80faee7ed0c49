import { journalRows } from "@crw/tools/delegation";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { INTERRUPTED_CONTEXT, recoverDelegations } from "../../src/index.js";
import { makeService, messages, newParent, scriptTask, waitFor } from "./helpers.js";

const db = useTestDatabase();

async function queuedRun(service: ReturnType<typeof makeService>["service"], task: string, fork = false) {
  const { account, parent } = await newParent(service);
  await service.prompt(parent.id, account.id, scriptTask({ answer: "idle now" }));
  const d = await service.repo.createDelegation({
    parentSessionId: parent.id,
    principalAccountId: account.id,
    toolCallId: "t1",
    task,
    mode: "background",
    model: "scripted",
    scope: JSON.stringify({ accountId: account.id, target: { kind: "host", ref: null } }),
    ...(fork ? { fork: { fromSessionId: parent.id } } : {}),
  });
  return { account, parent, run: d.run, child: d.child };
}

async function parentMessages(
  service: ReturnType<typeof makeService>["service"],
  parentId: string,
  accountId: string,
) {
  await waitFor(
    async () => (await service.repo.queuedResultIds(parentId, accountId)).length === 0,
    "delivery",
  );
  await service.whenIdle();
  return messages(await service.repo.readJournal(parentId, accountId));
}

/** A tool call the crashed turn had asked for and journaled the intent of, nothing after. */
async function appendInterruptedToolCall(
  repo: ReturnType<typeof makeService>["repo"],
  child: string,
  accountId: string,
): Promise<void> {
  await repo.append(child, accountId, [
    journalRows.asking("x-1", "Nothing"),
    journalRows.intent("x-1", "Nothing"),
  ]);
}

describe("boot recovery", () => {
  it("a Delegate that never started is terminalized with an error result, and the parent wakes without user input (S004-188)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent, run } = await queuedRun(service, scriptTask({ answer: "never" }));
    const report = await recoverDelegations(service);
    expect(report.terminalized).toContain(run.id);
    expect((await repo.getRun(run.id, account.id)).status).toBe("failed");
    const msgs = await parentMessages(service, parent.id, account.id);
    expect(msgs.at(-2)).toMatchObject({ role: "custom", details: { outcome: "error" } });
    expect(msgs.at(-1)).toMatchObject({ role: "assistant", content: [{ type: "text", text: "noted (1)" }] });
    const child = await repo.readJournal(run.childSessionId ?? "", account.id);
    expect(child).toEqual([]);
    await service.close();
  });

  it("boot discards an unfinished fork copy before claiming, and the parent's run settles through the missing-child path (S004-247 S004-248)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent, run, child } = await queuedRun(service, "forked task", true);
    const order: string[] = [];
    const discard = repo.discardPrivateSessions.bind(repo);
    repo.discardPrivateSessions = async () => {
      const ids = await discard();
      order.push("discarded");
      return ids;
    };
    const claim = repo.claimOpenRuns.bind(repo);
    repo.claimOpenRuns = async (...args) => {
      order.push("claiming");
      return claim(...args);
    };
    const report = await recoverDelegations(service);
    expect(order).toEqual(["discarded", "claiming"]);
    expect(report.discardedForks).toContain(child.id);
    expect(report.terminalized).toContain(run.id);
    const msgs = await parentMessages(service, parent.id, account.id);
    expect(msgs.some((m) => m.role === "custom" && m.content.includes("discarded"))).toBe(true);
    await expect(repo.getSession(child.id, account.id)).rejects.toMatchObject({ code: "not_found" });
    await service.close();
  });

  it("a run beyond its recovery attempts gets an ordinary error result telling the parent to verify the last step (S004-030 S004-031)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent, run } = await queuedRun(service, scriptTask({ answer: "x" }));
    await repo.startRun(run.id, run.generation, "dead-owner");
    await db.pool.query("update subagent_runs set recovery_attempts = 3 where id = $1", [run.id]);
    // the attempts bound continuations that would follow a tool call of unknown outcome
    await appendInterruptedToolCall(repo, run.childSessionId ?? "", account.id);
    const report = await recoverDelegations(service, { maxRecoveryAttempts: 3 });
    expect(report.failed).toContain(run.id);
    const msgs = await parentMessages(service, parent.id, account.id);
    const result = msgs.find((m) => m.role === "custom");
    expect(result?.content).toMatch(/verify the child's last step before using DelegateContinue/);
    // An ordinary error result, and the parent's own follow-up turn answers it with no user input.
    expect(result).toMatchObject({ details: { outcome: "error" } });
    expect(msgs.at(-2)).toBe(result);
    expect(msgs.at(-1)).toMatchObject({ role: "assistant", content: [{ type: "text", text: "noted (1)" }] });
    expect(await repo.getRun(run.id, account.id)).toMatchObject({ status: "failed" });
    await service.close();
  });

  it("an interrupted turn continues through its interrupted-result context, charging one attempt", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent, run } = await queuedRun(
      service,
      scriptTask({ rounds: [[{ name: "Nothing", arguments: {} }]], answer: "finished" }),
    );
    await repo.startRun(run.id, run.generation, "dead-owner");
    const child = run.childSessionId ?? "";
    await appendInterruptedToolCall(repo, child, account.id);
    const report = await recoverDelegations(service);
    expect(report.unknownToolCalls).toBe(1);
    expect(report.continued).toContain(run.id);
    await parentMessages(service, parent.id, account.id);
    const msgs = messages(await repo.readJournal(child, account.id));
    expect(msgs.map((m) => m.role)).toEqual(["user", "assistant", "toolResult", "custom", "assistant"]);
    expect(msgs[3]).toMatchObject({ customType: "interrupted", content: INTERRUPTED_CONTEXT });
    expect(msgs[4]).toMatchObject({ content: [{ type: "text", text: "finished" }] });
    const after = await repo.getRun(run.id, account.id);
    expect(after).toMatchObject({ status: "succeeded", recoveryAttempts: 1, generation: 2 });
    await service.close();
  });

  it("a child interrupted while it waited on its model goes on without a recovery attempt, even at the attempt limit (S004-143)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent, run } = await queuedRun(service, scriptTask({ answer: "went on" }));
    await repo.startRun(run.id, run.generation, "dead-owner");
    const child = run.childSessionId ?? "";
    // its task is journaled, its model call was in flight: nothing of unknown outcome happened
    await repo.append(child, account.id, [journalRows.user("the task")]);
    await db.pool.query("update subagent_runs set recovery_attempts = 3 where id = $1", [run.id]);
    const report = await recoverDelegations(service, { maxRecoveryAttempts: 3 });
    expect(report.continued).toContain(run.id);
    expect(report.failed).not.toContain(run.id);
    await parentMessages(service, parent.id, account.id);
    expect(await repo.getRun(run.id, account.id)).toMatchObject({
      status: "succeeded",
      recoveryAttempts: 3,
      freeContinuations: 1,
      generation: 2,
    });
    const msgs = messages(await repo.readJournal(child, account.id));
    expect(msgs.at(-1)).toMatchObject({ role: "assistant", content: [{ type: "text", text: "went on" }] });
    await service.close();
  });

  it("a child whose tool calls had all answered before the interruption goes on without a recovery attempt", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent, run } = await queuedRun(service, scriptTask({ answer: "after the tool" }));
    await repo.startRun(run.id, run.generation, "dead-owner");
    const child = run.childSessionId ?? "";
    await repo.append(child, account.id, [
      journalRows.user("the task"),
      journalRows.asking("x-1", "Nothing"),
      journalRows.result("x-1", "done", "Nothing"),
    ]);
    const report = await recoverDelegations(service);
    expect(report.unknownToolCalls).toBe(0);
    expect(report.continued).toContain(run.id);
    await parentMessages(service, parent.id, account.id);
    expect(await repo.getRun(run.id, account.id)).toMatchObject({
      recoveryAttempts: 0,
      freeContinuations: 1,
    });
    await service.close();
  });

  it("free continuations are bounded: a child interrupted at its model five times per allowed attempt ends with a recovery_failed result", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent, run } = await queuedRun(service, scriptTask({ answer: "never" }));
    await repo.startRun(run.id, run.generation, "dead-owner");
    await repo.append(run.childSessionId ?? "", account.id, [journalRows.user("the task")]);
    await db.pool.query("update subagent_runs set free_continuations = 10 where id = $1", [run.id]);
    const report = await recoverDelegations(service, { maxRecoveryAttempts: 2 });
    expect(report.failed).toContain(run.id);
    const msgs = await parentMessages(service, parent.id, account.id);
    expect(msgs.find((m) => m.role === "custom")?.content).toMatch(
      /interrupted 10 times while it waited on its model/,
    );
    expect(await repo.getRun(run.id, account.id)).toMatchObject({
      status: "failed",
      error: { code: "recovery_failed" },
    });
    await service.close();
  });

  it("an empty transcript continues with the original task", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent, run } = await queuedRun(service, "plain task");
    // started (running) but its task never reached the journal: the state a legacy writer could leave
    await db.pool.query("update subagent_runs set status = 'running', locked_by = 'dead' where id = $1", [
      run.id,
    ]);
    await recoverDelegations(service);
    await parentMessages(service, parent.id, account.id);
    const msgs = messages(await repo.readJournal(run.childSessionId ?? "", account.id));
    expect(msgs[0]).toEqual({ role: "user", content: "plain task" });
    expect(msgs[1]).toMatchObject({ content: [{ type: "text", text: "answer: plain task" }] });
    await service.close();
  });

  it("boot ownership and settling a turn that had finished charge no recovery attempt (S004-143)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent, run } = await queuedRun(service, "finished before the crash");
    await repo.startRun(run.id, run.generation, "dead-owner");
    await repo.append(run.childSessionId ?? "", account.id, [
      {
        body: {
          type: "message",
          message: { role: "assistant", content: [{ type: "text", text: "all done" }], stopReason: "stop" },
        },
      },
    ]);
    const report = await recoverDelegations(service);
    expect(report.settledWithoutTurn).toContain(run.id);
    const msgs = await parentMessages(service, parent.id, account.id);
    expect(msgs.find((m) => m.role === "custom")?.content.endsWith("\nall done")).toBe(true);
    expect(await repo.getRun(run.id, account.id)).toMatchObject({
      status: "succeeded",
      recoveryAttempts: 0,
      generation: 1,
    });
    await service.close();
  });
});
