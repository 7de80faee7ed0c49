import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { createScriptedTurnRunner, type SessionTurnRunner } from "../../src/index.js";
import { makeService, newParent, queuedCall, scriptTask, waitFor } from "./helpers.js";

const db = useTestDatabase();

type Made = ReturnType<typeof makeService>;

/**
 * A service whose repository and runner record, for `watched` sessions, each inbox count (settlementWork,
 * or the settlement's look that counts it with the settling mark), each settling mark of its own and each
 * turn, in the order they happen.
 */
function observed() {
  const events: string[] = [];
  const watched = new Set<string>();
  const scripted = createScriptedTurnRunner();
  const runner: SessionTurnRunner = {
    runTurn(request, host) {
      if (watched.has(request.sessionId)) events.push("turn");
      return scripted.runTurn(request, host);
    },
  };
  const made = makeService(db.pool, { runner });
  const count = made.repo.settlementWork.bind(made.repo);
  made.repo.settlementWork = (sessionId, principal) => {
    if (watched.has(sessionId)) events.push("count");
    return count(sessionId, principal);
  };
  const look = made.repo.markSettlingWithReply.bind(made.repo);
  made.repo.markSettlingWithReply = (runId, generation, sessionId, principal, options) => {
    if (watched.has(sessionId)) events.push(options?.whenIdle ? "count" : "mark");
    return look(runId, generation, sessionId, principal, options);
  };
  return { ...made, events, watched };
}

const rolesIn = async (made: Made, sessionId: string, accountId: string) =>
  (await made.repo.readJournal(sessionId, accountId)).flatMap((e) =>
    e.body.type === "message" ? [`${e.body.message.role}`] : [],
  );

describe("a call's first turn looks at the inbox its start read", () => {
  it("a fresh call's child is counted once, by the settlement drain after its turn, not again before it; the settling mark rides on that count", async () => {
    const made = observed();
    const caller = await newParent(made.service);
    const run = await queuedCall(made.service, caller, "call", scriptTask({ answer: "done" }));
    made.watched.add(run.childSessionId ?? "");
    await made.service.executeRun(run);
    expect(made.events).toEqual(["turn", "count"]);
    await made.service.close();
  });

  it("a steer pending when the call starts is taken by its first turn", async () => {
    const made = observed();
    const caller = await newParent(made.service);
    const run = await queuedCall(made.service, caller, "call", scriptTask({ answer: "done" }));
    const child = run.childSessionId ?? "";
    await made.repo.enqueueSteer(child, caller.account.id, "also this");
    made.watched.add(child);
    await made.service.executeRun(run);
    // task, steer, then the one answer: the steer went into the first turn, no follow-up turn ran
    expect(await rolesIn(made, child, caller.account.id)).toEqual(["user", "user", "assistant"]);
    expect(made.events).toEqual(["turn", "count"]);
    const { rows } = await db.pool.query("select status from delegated_steers where child_session_id = $1", [
      child,
    ]);
    expect(rows.map((r) => r.status)).toEqual(["delivered"]);
    await made.service.close();
  });

  it("a child with an open call of its own counts its inbox again before its first turn", async () => {
    const made = observed();
    const caller = await newParent(made.service);
    const run = await queuedCall(made.service, caller, "call", scriptTask({ answer: "done" }));
    const child = run.childSessionId ?? "";
    // the child's own open call: its result could start a result turn of the child at any time
    const { run: helper } = await made.repo.createDelegation({
      parentSessionId: child,
      principalAccountId: caller.account.id,
      toolCallId: "helper",
      task: "h",
      mode: "background",
      model: "scripted",
      scope: (await made.repo.getSession(child, caller.account.id)).scope ?? "",
    });
    made.watched.add(child);
    const settled = made.service.executeRun(run);
    await waitFor(async () => made.events.includes("turn"), "the first turn");
    await made.repo.settleRun({
      runId: helper.id,
      generation: helper.generation,
      resultId: randomUUID(),
      outcome: "ok",
      body: "helped",
      byteSize: 6,
    });
    await settled;
    expect(made.events[0]).toBe("count");
    expect(made.events[1]).toBe("turn");
    await made.service.close();
  });
});
