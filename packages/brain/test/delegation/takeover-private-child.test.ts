import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it, onTestFailed } from "vitest";
import { takeOverDelegations } from "../../src/index.js";
import { makeService, messages, newParent, scriptTask, waitFor } from "./helpers.js";

/**
 * A live takeover of a dead owner whose fork copy never committed: the copy (a private child) can never
 * become readable, so it goes as the boot's would, and its run settles through the missing-child path.
 */
const db = useTestDatabase();

describe("live takeover of a dead owner's unfinished fork copy", () => {
  it("discards the dead owner's private copy only, ends its run with the missing-child error and continues the rest of the batch; the next pass finds nothing", async () => {
    const { service, repo } = makeService(db.pool);
    await service.start();
    const { account, parent } = await newParent(service);
    const scope = JSON.stringify({ accountId: account.id, target: { kind: "host", ref: null } });
    const delegate = (name: string, fork: boolean) =>
      repo.createDelegation({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: `${name}-${randomUUID()}`,
        task: scriptTask({ answer: `${name} done` }),
        mode: "background",
        model: "scripted",
        scope,
        ...(fork && { fork: { fromSessionId: parent.id } }),
      });
    const plain = await delegate("plain", false);
    const deadFork = await delegate("dead fork", true);
    // a live process's copy in progress: its run is leased by an owner that holds its lock
    const liveFork = await delegate("live fork", true);
    const liveOwner = `live-${randomUUID()}`;
    const releaseLive = await repo.holdOwnerLease(liveOwner);
    onTestFailed(releaseLive);
    const dead = `dead-${randomUUID()}`;
    await repo.startRun(plain.run.id, plain.run.generation, dead);
    await repo.startRun(deadFork.run.id, deadFork.run.generation, dead);
    await repo.startRun(liveFork.run.id, liveFork.run.generation, liveOwner);

    const report = await takeOverDelegations(service);
    expect(report.discardedForks).toEqual([deadFork.child.id]);
    expect(report.terminalized).toEqual([deadFork.run.id]);
    expect(report.handedBack).toEqual([]);
    expect(report.continued).toEqual([plain.run.id]);
    await expect(repo.getSession(deadFork.child.id, account.id)).rejects.toMatchObject({ code: "not_found" });
    const visibility = await db.pool.query("select visibility from sessions where id = $1", [
      liveFork.child.id,
    ]);
    expect(visibility.rows).toEqual([{ visibility: "private" }]);

    await waitFor(
      async () => (await repo.getRun(plain.run.id, account.id)).status === "succeeded",
      "the plain run",
    );
    const ended = await repo.getRun(deadFork.run.id, account.id);
    expect(ended).toMatchObject({ status: "failed", childSessionId: null });
    await service.whenIdle();
    const msgs = messages(await repo.readJournal(parent.id, account.id));
    expect(msgs.some((m) => m.role === "custom" && m.content.includes("discarded"))).toBe(true);
    // no run left to claim and hand back again on every pass
    expect((await takeOverDelegations(service)).handedBack).toEqual([]);
    const row = await db.pool.query("select status, locked_by from subagent_runs where id = $1", [
      liveFork.run.id,
    ]);
    expect(row.rows).toEqual([{ status: "running", locked_by: liveOwner }]);
    await releaseLive();
    await service.close();
  });
});
