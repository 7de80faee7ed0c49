import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { messages, newParent, observeReads, queuedCall, scriptTask } from "./helpers.js";

const db = useTestDatabase();

describe("a fresh call's first turn folds the journal its start wrote", () => {
  it("reads no journal before its first turn, whose context is the task its start journaled", async () => {
    const made = observeReads(db.pool);
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
    const made = observeReads(db.pool, async (child) => {
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
    const made = observeReads(db.pool);
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
