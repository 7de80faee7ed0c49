import type { TranscriptMessage } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { createScriptedTurnRunner, type SessionTurnRunner } from "../../src/index.js";
import { makeService, messages, newParent, queuedCall, scriptTask } from "./helpers.js";

const db = useTestDatabase();

/**
 * A service whose repository and runner record, for `watched` sessions, each journal read (with the seq it
 * reads after) and each turn (with the roles of its context), in the order they happen. `duringTurn` runs
 * inside the watched session's first turn.
 */
function observed(duringTurn?: (sessionId: string) => Promise<void>) {
  const events: string[] = [];
  const contexts: TranscriptMessage[][] = [];
  const watched = new Set<string>();
  const scripted = createScriptedTurnRunner();
  let turns = 0;
  const runner: SessionTurnRunner = {
    async runTurn(request, host) {
      if (watched.has(request.sessionId)) {
        events.push(`turn(${request.context.map((m) => m.role).join(",")})`);
        contexts.push([...request.context]);
        if (turns++ === 0) await duringTurn?.(request.sessionId);
      }
      return scripted.runTurn(request, host);
    },
  };
  const made = makeService(db.pool, { runner });
  const read = made.repo.readJournalAfter.bind(made.repo);
  made.repo.readJournalAfter = (sessionId, principal, afterSeq) => {
    if (watched.has(sessionId)) events.push(`read(${afterSeq})`);
    return read(sessionId, principal, afterSeq);
  };
  return { ...made, events, contexts, watched };
}

describe("a fresh call's first turn folds the journal its start wrote", () => {
  it("reads no journal before its first turn, whose context is the task its start journaled", async () => {
    const made = observed();
    const caller = await newParent(made.service);
    const task = scriptTask({ answer: "done" });
    const run = await queuedCall(made.service, caller, "call", task);
    made.watched.add(run.childSessionId ?? "");
    await made.service.executeRun(run);
    expect(made.events).toEqual(["turn(user)"]);
    expect(made.contexts[0]?.[0]).toEqual({ role: "user", content: task });
    const rows = await made.repo.readJournal(run.childSessionId ?? "", caller.account.id);
    expect(messages(rows).map((m) => m.role)).toEqual(["user", "assistant"]);
    await made.service.close();
  });

  it("a follow-up turn of that child reads only the rows after the task: the fold the start's row made holds", async () => {
    const made = observed(async (child) => {
      await made.repo.enqueueSteer(child, principal, "also this");
    });
    const caller = await newParent(made.service);
    const principal = caller.account.id;
    const run = await queuedCall(made.service, caller, "call", scriptTask({ answer: "done" }));
    made.watched.add(run.childSessionId ?? "");
    await made.service.executeRun(run);
    // the steer came during the first turn: the settlement drain journals it and runs a follow-up turn
    expect(made.events).toEqual(["turn(user)", "read(1)", "turn(user,assistant,user)"]);
    await made.service.close();
  });

  it("a steer pending when the call starts is journaled before the first turn, which then reads the journal", async () => {
    const made = observed();
    const caller = await newParent(made.service);
    const run = await queuedCall(made.service, caller, "call", scriptTask({ answer: "done" }));
    const child = run.childSessionId ?? "";
    await made.repo.enqueueSteer(child, caller.account.id, "also this");
    made.watched.add(child);
    await made.service.executeRun(run);
    expect(made.events).toEqual(["read(0)", "turn(user,user)"]);
    await made.service.close();
  });
});
