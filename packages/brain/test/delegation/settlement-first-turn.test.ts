import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { delegateForeground, makeService, newParent, queuedCall, recording, scriptTask } from "./helpers.js";

const db = useTestDatabase();

describe("a call's first turn and its reply", () => {
  it("a call stopped before its first turn runs no model turn and settles as aborted", async () => {
    const { seen, runner } = recording();
    const made = makeService(db.pool, { runner });
    const caller = await newParent(made.service);
    const run = await queuedCall(made.service, caller, "call", scriptTask({ answer: "never" }));
    const stop = new AbortController();
    stop.abort();
    const resultId = await made.service.executeRun(run, { signal: stop.signal });
    expect(seen.filter((r) => r.sessionId === run.childSessionId)).toEqual([]);
    expect(await made.repo.getResult(resultId, caller.account.id)).toMatchObject({ outcome: "error" });
    expect((await made.repo.getRun(run.id, caller.account.id)).status).toBe("failed");
    await made.service.close();
  });

  it("a turn that ends without any assistant message settles with no answer, not a failure", async () => {
    const made = makeService(db.pool);
    const caller = await newParent(made.service);
    const run = await queuedCall(made.service, caller, "call", scriptTask({ answer: "unused" }));
    // from here on, every turn ends at once and writes nothing
    const silent = makeService(db.pool, { runner: { runTurn: async () => ({ stopReason: "stop" }) } });
    const resultId = await silent.service.executeRun(run);
    expect(await silent.repo.getResult(resultId, caller.account.id)).toMatchObject({
      outcome: "ok",
      body: "(the child gave no answer)",
    });
    await silent.service.close();
    await made.service.close();
  });
});

describe("what a settled call's run records", () => {
  it("a call that settles ok records no error on its run; a failed one records its code and message", async () => {
    const made = makeService(db.pool);
    const caller = await newParent(made.service);
    const ok = await delegateForeground(made.service, caller, "ok", scriptTask({ answer: "fine" }));
    const failed = await delegateForeground(
      made.service,
      caller,
      "bad",
      scriptTask({ answer: "never", failAtRequest: 0 }),
    );
    if (ok.kind !== "result" || failed.kind !== "result") throw new Error("expected results");
    expect((await made.repo.getRun(ok.runId, caller.account.id)).error).toBeNull();
    expect((await made.repo.getRun(failed.runId, caller.account.id)).error).toEqual({
      code: "child_failed",
      message: "scripted provider failure",
    });
    await made.service.close();
  });
});
