import { randomUUID } from "node:crypto";
import { journalRows } from "@crw/tools/delegation";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it, onTestFailed } from "vitest";
import { takeOverDelegations } from "../../src/index.js";
import { makeService, messages, newParent, scriptTask, waitFor } from "./helpers.js";

/**
 * The live takeover pass over real PostgreSQL: only runs leased by an owner that holds no advisory lock
 * are taken (never a live owner's, never one nobody leased yet, never this owner's own), each continued
 * once (uncharged: nothing of unknown outcome was cut in the children); the root parent's interrupted tail is settled before anything continues
 * and the parent's follow-up turn runs here.
 */
const db = useTestDatabase();

const { asking, intent } = journalRows;

describe("live takeover", () => {
  it("takes a dead owner's run only, charges it once, settles the parent's tail and follows the parent up", async () => {
    const { service, repo } = makeService(db.pool);
    await service.start();
    const { account, parent } = await newParent(service);
    const delegation = (i: number) =>
      repo.createDelegation({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: `t${i}-${randomUUID()}`,
        task: scriptTask({ answer: `child ${i} done` }),
        mode: "background",
        model: "scripted",
        scope: JSON.stringify({ accountId: account.id, target: { kind: "host", ref: null } }),
      });
    const liveOwner = `live-${randomUUID()}`;
    const release = await repo.holdOwnerLease(liveOwner);
    let held = true;
    const releaseLive = async () => {
      if (!held) return;
      held = false;
      await release();
    };
    // the lease holds a connection of the file's pool: a failure must not keep it (see makeService)
    onTestFailed(releaseLive);
    const live = (await delegation(1)).run;
    await repo.startRun(live.id, live.generation, liveOwner);
    const unleased = (await delegation(2)).run;
    const dead = (await delegation(3)).run;
    await repo.startRun(dead.id, dead.generation, `dead-${randomUUID()}`);
    // The dead owner was in the middle of the parent's own turn: a tool call with no result.
    await repo.append(parent.id, account.id, [asking("w1"), intent("w1")]);

    expect(await repo.orphanedWork()).toMatchObject({ runs: true });
    const report = await takeOverDelegations(service);
    expect(report.continued).toEqual([dead.id]);
    expect(report.roots).toEqual([parent.id]);
    expect(report.unknownToolCalls).toBe(1);
    // the run nobody leased yet is left to the process about to start it: not claimed, not ended
    expect(report.terminalized).toEqual([]);
    expect((await repo.getRun(unleased.id, account.id)).status).toBe("queued");
    const attempts = async (id: string) =>
      (await db.pool.query("select recovery_attempts, locked_by from subagent_runs where id = $1", [id]))
        .rows[0];
    expect(await attempts(live.id)).toEqual({ recovery_attempts: 0, locked_by: liveOwner });
    expect(await attempts(unleased.id)).toEqual({ recovery_attempts: 0, locked_by: null });

    // The result reaches the parent once, and the parent's follow-up turn answers it here.
    await waitFor(
      async () => (await repo.getRun(dead.id, account.id)).status === "succeeded",
      "the dead run",
    );
    await waitFor(
      async () => (await repo.queuedResultIds(parent.id, account.id)).length === 0,
      "the delivery",
    );
    await service.whenIdle();
    const msgs = messages(await repo.readJournal(parent.id, account.id));
    expect(msgs.filter((m) => m.role === "toolResult" && m.toolCallId === "w1")).toHaveLength(1);
    expect(msgs.filter((m) => m.role === "custom" && m.content.includes("child 3 done"))).toHaveLength(1);
    expect(msgs.at(-1)).toMatchObject({ role: "assistant" });
    // continued once; its child was waiting on its model (nothing of unknown outcome): not charged
    expect(
      (await db.pool.query("select free_continuations from subagent_runs where id = $1", [dead.id])).rows[0],
    ).toEqual({ free_continuations: 1 });

    // A repeated pass finds nothing more; the live owner's run becomes takeable only once its lock is gone.
    expect((await takeOverDelegations(service)).continued).toEqual([]);
    await releaseLive();
    const later = await takeOverDelegations(service);
    expect(later.continued).toEqual([live.id]);
    await waitFor(
      async () => (await repo.getRun(live.id, account.id)).status === "succeeded",
      "the live run",
    );
    expect(await attempts(unleased.id)).toEqual({ recovery_attempts: 0, locked_by: null });
    await service.whenIdle();
    await service.close();
  });

  it("a run the pass cannot recover now is handed back, and the next pass takes it", async () => {
    const { repo: real } = makeService(db.pool);
    let failFor: string | undefined;
    // The database failing under one run's recovery (a lost connection): that read only, once.
    const repo = new Proxy(real, {
      get(target, key, receiver) {
        const value = Reflect.get(target, key, receiver) as unknown;
        const reads = ["readJournalTail", "journalTailWithWork", "journalTailsWithWork"];
        if (typeof key !== "string" || !reads.includes(key) || typeof value !== "function") return value;
        return (...args: unknown[]) => {
          const first = args[0];
          // the batched read lists the sessions it reads
          const of = Array.isArray(first) ? first.some((s) => s.sessionId === failFor) : first === failFor;
          if (failFor !== undefined && of) {
            failFor = undefined;
            return Promise.reject(new Error("connection terminated unexpectedly"));
          }
          return (value as (...a: unknown[]) => unknown).apply(target, args);
        };
      },
    });
    const { service } = makeService(db.pool, { repo });
    await service.start();
    const { account, parent } = await newParent(service);
    const { run, child } = await repo.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: `t-${randomUUID()}`,
      task: scriptTask({ answer: "handed back, then done" }),
      mode: "background",
      model: "scripted",
      scope: JSON.stringify({ accountId: account.id, target: { kind: "host", ref: null } }),
    });
    await repo.startRun(run.id, run.generation, `dead-${randomUUID()}`);
    failFor = child.id;
    const first = await takeOverDelegations(service);
    expect(first.handedBack).toEqual([run.id]);
    expect(first.continued).toEqual([]);
    const row = (
      await db.pool.query("select locked_by, recovery_attempts from subagent_runs where id = $1", [run.id])
    ).rows[0];
    expect(row).toEqual({ locked_by: `${service.owner}:handed-back`, recovery_attempts: 0 });
    expect((await repo.orphanedWork()).runs).toBe(true);

    const second = await takeOverDelegations(service);
    expect(second.continued).toEqual([run.id]);
    await waitFor(async () => (await repo.getRun(run.id, account.id)).status === "succeeded", "the run");
    await service.whenIdle();
    await service.close();
  });
});
