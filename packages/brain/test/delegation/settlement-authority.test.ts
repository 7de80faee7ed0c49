import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { delegateForeground, makeService, newParent, queuedCall, scriptTask } from "./helpers.js";

const db = useTestDatabase();

/**
 * A service that counts its reads of a session with its account (`reads`) and of a session alone
 * (`sessionReads`), by session id.
 */
function countingAuthorityReads() {
  const made = makeService(db.pool);
  const reads = new Map<string, number>();
  const sessionReads = new Map<string, number>();
  const read = made.repo.getSessionWithAccount.bind(made.repo);
  made.repo.getSessionWithAccount = async (sessionId, principal) => {
    reads.set(sessionId, (reads.get(sessionId) ?? 0) + 1);
    return read(sessionId, principal);
  };
  const readSession = made.repo.getSession.bind(made.repo);
  made.repo.getSession = async (sessionId, principal) => {
    sessionReads.set(sessionId, (sessionReads.get(sessionId) ?? 0) + 1);
    return readSession(sessionId, principal);
  };
  return { ...made, reads, sessionReads };
}

describe("the delegating side's live authority a call's scope is narrowed by", () => {
  it("a Delegate's call takes the parent and authority its admission just read: the parent is read once", async () => {
    const { service, reads } = countingAuthorityReads();
    const caller = await newParent(service);
    const receipt = await delegateForeground(service, caller, "fg", scriptTask({ answer: "done" }));
    expect(receipt).toMatchObject({ kind: "result", outcome: "ok", body: "done" });
    expect(reads.get(caller.parent.id)).toBe(1);
    await service.close();
  });

  it("a call run without that read (boot recovery's way) reads the parent's authority itself; the child's row comes with its start", async () => {
    const { service, reads, sessionReads } = countingAuthorityReads();
    const caller = await newParent(service);
    const run = await queuedCall(service, caller, "queued", scriptTask({ answer: "done" }));
    reads.clear();
    sessionReads.clear();
    const resultId = await service.executeRun(run);
    expect((await service.repo.getResult(resultId, caller.account.id)).body).toBe("done");
    expect(reads.get(caller.parent.id)).toBe(1);
    expect(sessionReads.get(run.childSessionId ?? "")).toBeUndefined();
    await service.close();
  });
});
