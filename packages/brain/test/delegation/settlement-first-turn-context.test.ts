import { randomUUID } from "node:crypto";
import type { JournalDelta, SettlementWork } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { parseDelegatedExecutionScope } from "../../src/index.js";
import { latch, makeService, newParent, queuedCall, recording, scriptTask } from "./helpers.js";

const db = useTestDatabase();

/**
 * A service whose repository holds the child's first inbox look (the drain of the turn that takes the
 * lock first) until `look.release` opens, and tells when the call's start has committed and what it read.
 */
function heldService() {
  const { seen, runner } = recording();
  const made = makeService(db.pool, { runner });
  const look = { held: latch(), release: latch() };
  const started = latch();
  const start: { journal?: JournalDelta; work?: SettlementWork } = {};
  let childId = "";
  let holding = true;
  const work = made.repo.settlementWork.bind(made.repo);
  made.repo.settlementWork = async (sessionId, principal) => {
    if (sessionId === childId && holding) {
      holding = false;
      look.held.open();
      await look.release.promise;
    }
    return work(sessionId, principal);
  };
  const startRun = made.repo.startRun.bind(made.repo);
  made.repo.startRun = async (...args) => {
    const out = await startRun(...args);
    if (args[3] === childId) {
      if (out.journal) start.journal = out.journal;
      if (out.work) start.work = out.work;
      started.open();
    }
    return out;
  };
  const watch = (id: string) => {
    childId = id;
  };
  return { ...made, seen, look, started, start, watch };
}

/** A call queued on a fresh child that `made` watches: its start and its child's first inbox look. */
async function watchedCall(made: ReturnType<typeof heldService>) {
  const caller = await newParent(made.service);
  const principal = caller.account.id;
  const run = await queuedCall(made.service, caller, "call", scriptTask({ answer: "done" }));
  const childId = run.childSessionId ?? "";
  made.watch(childId);
  const child = await made.repo.getSession(childId, principal);
  return { principal, run, childId, child };
}

describe("a fresh call's first turn, queued behind a turn of its child that held the lock at the start", () => {
  it("gets the journal as that turn left it, with the helper result and answer it added, not the start's copy", async () => {
    const made = heldService();
    const { principal, run, childId, child } = await watchedCall(made);
    // the child's background helper, still open when the call starts
    const { run: helper } = await made.repo.createDelegation({
      parentSessionId: childId,
      principalAccountId: principal,
      toolCallId: "helper",
      task: "helper",
      mode: "background",
      model: "scripted",
      scope: child.scope ?? "",
    });
    // a result turn of the child takes its lock first and waits at its inbox look
    const other = made.service.runChildTurn(child, parseDelegatedExecutionScope(child.scope ?? ""), () => {});
    await made.look.held.promise;
    const call = made.service.executeRun(run);
    await made.started.promise;
    // the start read the whole journal (its task alone) with the helper open: that copy is stale from here on
    expect(made.start.journal?.entries).toHaveLength(1);
    expect(made.start.work?.openChildRuns).toBe(1);
    // the helper settles after the start; the waiting turn takes its result and answers
    const resultId = randomUUID();
    await made.repo.settleRun({
      runId: helper.id,
      generation: helper.generation,
      resultId,
      outcome: "ok",
      body: "helper found 42",
      byteSize: Buffer.byteLength("helper found 42"),
    });
    made.look.release.open();
    expect((await other).delivered).toEqual([resultId]);
    await call;
    const turns = made.seen.filter((r) => r.sessionId === childId);
    // the other turn ran first, after the start had journaled the task
    expect(turns.map((t) => t.context.map((m) => m.role))[0]).toEqual(["user", "custom"]);
    expect(turns).toHaveLength(2);
    // the call's first turn: the task, the helper's result and the other turn's answer, not the start's copy
    const context = turns[1]?.context ?? [];
    expect(context.map((m) => m.role)).toEqual(["user", "custom", "assistant"]);
    expect(JSON.stringify(context[1])).toContain("helper found 42");
    expect(context[2]).toMatchObject({ content: [{ type: "text", text: "done" }] });
    await made.service.close();
  });

  it("gets the journal as that turn left it when that turn ends before the call's first turn looks, with no helper open", async () => {
    const made = heldService();
    const { run, childId, child } = await watchedCall(made);
    // a turn of the child holds its lock when the call starts, nothing else open
    const other = made.service.runChildTurn(child, parseDelegatedExecutionScope(child.scope ?? ""), () => {});
    await made.look.held.promise;
    // the call is held at its read of the caller's live authority, between its start and its first turn
    const authority = latch();
    const read = made.repo.getSessionWithAccount.bind(made.repo);
    made.repo.getSessionWithAccount = async (...args) => {
      await authority.promise;
      return read(...args);
    };
    const call = made.service.executeRun(run);
    await made.started.promise;
    expect(made.start.journal?.entries).toHaveLength(1);
    expect(made.start.work?.openChildRuns).toBe(0);
    // the other turn answers and ends while the call is still on its way to its first turn
    made.look.release.open();
    await other;
    authority.open();
    await call;
    const turns = made.seen.filter((r) => r.sessionId === childId);
    expect(turns).toHaveLength(2);
    expect(turns[0]?.context.map((m) => m.role)).toEqual(["user"]);
    // the call's first turn folds the other turn's answer: the start's copy ended at the task
    expect(turns[1]?.context.map((m) => m.role)).toEqual(["user", "assistant"]);
    await made.service.close();
  });
});
