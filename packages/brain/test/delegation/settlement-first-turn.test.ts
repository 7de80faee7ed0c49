import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { parseDelegatedExecutionScope } from "../../src/index.js";
import { type Caller, delegateForeground, makeService, newParent, recording, scriptTask } from "./helpers.js";

const db = useTestDatabase();

type Made = ReturnType<typeof makeService>;

/** A queued call (not run yet) of `caller`, with the scope a Delegate of this parent captures. */
async function queuedCall(made: Made, caller: Caller, task: string) {
  const first = await delegateForeground(
    made.service,
    caller,
    `scope-${randomUUID()}`,
    scriptTask({ answer: "x" }),
  );
  if (first.kind !== "result") throw new Error("expected a result");
  const scope = (await made.repo.getSession(first.childSessionId, caller.account.id)).scope ?? "";
  const { run } = await made.repo.createDelegation({
    parentSessionId: caller.parent.id,
    principalAccountId: caller.account.id,
    toolCallId: `call-${randomUUID()}`,
    task,
    mode: "background",
    model: "scripted",
    scope,
  });
  return run;
}

describe("a call's first turn and its reply", () => {
  it("a call stopped before its first turn runs no model turn and settles as aborted", async () => {
    const { seen, runner } = recording();
    const made = makeService(db.pool, { runner });
    const caller = await newParent(made.service);
    const run = await queuedCall(made, caller, scriptTask({ answer: "never" }));
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
    const run = await queuedCall(made, caller, scriptTask({ answer: "unused" }));
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

describe("a failed drain's result id", () => {
  it("a failed drain that took only a text follow-up carries no result id (S004-052)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const first = await delegateForeground(
      service,
      { parent, account },
      "c",
      scriptTask({ answer: "first", failAtRequest: 1 }),
    );
    if (first.kind !== "result") throw new Error("expected result");
    const child = await repo.getSession(first.childSessionId, account.id);
    await repo.enqueueSteer(child.id, account.id, "one more thing");
    const out = await service.drainPendingResults(
      child,
      parseDelegatedExecutionScope(child.scope ?? ""),
      () => {},
    );
    expect(out).toMatchObject({ kind: "failed", reason: "scripted provider failure" });
    expect(out.kind === "failed" && out.resultId).toBeUndefined();
    await service.close();
  });
});
