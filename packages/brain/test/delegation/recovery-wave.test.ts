import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { recoverDelegations, settleInterruptedTails } from "../../src/index.js";
import {
  deadOwnersRun,
  finished,
  gateTool,
  latch,
  makeService,
  newParent,
  recording,
  repoWith,
  scriptTask,
  waitFor,
} from "./helpers.js";

/**
 * What boot recovery reads for the runs it starts: each parent once for the wave of executions (as
 * Delegate reads it just before admitting a call), a child its batch read does not find, and no read for
 * a pass over no sessions.
 */
const db = useTestDatabase();

describe("the reads of a boot pass", () => {
  it("reads a parent once for a wave of its calls, and the executions start from that read", async () => {
    const reads = { getSession: 0, getSessionWithAccount: 0 };
    const watched = new Set<string>();
    const counted =
      <A extends unknown[], R>(key: keyof typeof reads, real: (id: string, ...rest: A) => R) =>
      (id: string, ...rest: A) => {
        if (watched.has(id)) reads[key]++;
        return real(id, ...rest);
      };
    const repo = repoWith(db.pool, {
      getSession: (real) => counted("getSession", real),
      getSessionWithAccount: (real) => counted("getSessionWithAccount", real),
    });
    const gates = new Map<string, Promise<void>>();
    const gate = latch();
    gates.set("k", gate.promise);
    const { seen, runner } = recording();
    const { service } = makeService(db.pool, { repo, runner, tools: () => [gateTool("Gate", gates)] });
    await service.start();
    const caller = await newParent(service);
    const task = scriptTask({ rounds: [[{ name: "Gate", arguments: { key: "k" } }]], answer: "done" });
    const a = await deadOwnersRun(service, caller, task);
    const b = await deadOwnersRun(service, caller, task);
    watched.add(caller.parent.id);

    expect((await recoverDelegations(service)).continued).toEqual([a.run.id, b.run.id]);
    // Both turns are held at the gate: every read their starts needed is behind them.
    await waitFor(async () => new Set(seen.map((r) => r.sessionId)).size === 2, "both children's turns");
    const before = { ...reads };
    gate.open();
    expect(before).toEqual({ getSession: 1, getSessionWithAccount: 0 });
    await finished(service, a.run.id, caller.account.id);
    await finished(service, b.run.id, caller.account.id);
    await waitFor(
      async () => (await service.repo.queuedResultIds(caller.parent.id, caller.account.id)).length === 0,
      "the delivery",
    );
    await service.whenIdle();
    await service.close();
  });

  it("a claimed child its batch's read does not find fails the boot as not found, naming it; the rest of the batch goes on", async () => {
    let hidden: string | undefined;
    const repo = repoWith(db.pool, {
      journalTailsWithWork: (real) => async (sessions) => {
        const found = await real(sessions);
        if (hidden) found.delete(hidden);
        return found;
      },
    });
    const { service } = makeService(db.pool, { repo });
    await service.start();
    const caller = await newParent(service);
    const a = await deadOwnersRun(service, caller, scriptTask({ answer: "a done" }));
    const b = await deadOwnersRun(service, caller, scriptTask({ answer: "b done" }));
    hidden = a.child.id;
    await expect(recoverDelegations(service)).rejects.toMatchObject({
      code: "not_found",
      message: "session not found",
      context: { sessionId: a.child.id },
    });
    await finished(service, b.run.id, caller.account.id);
    expect((await repo.getRun(a.run.id, caller.account.id)).status).toBe("running");
    await service.close();

    // found again, the next boot recovers it
    hidden = undefined;
    const next = makeService(db.pool, { repo });
    expect((await recoverDelegations(next.service)).continued).toEqual([a.run.id]);
    await finished(next.service, a.run.id, caller.account.id);
    await waitFor(
      async () => (await repo.queuedResultIds(caller.parent.id, caller.account.id)).length === 0,
      "the delivery",
    );
    await next.service.whenIdle();
    await next.service.close();
  });

  it("settling the interrupted tails of no sessions reads nothing", async () => {
    let reads = 0;
    const repo = repoWith(db.pool, {
      sessionsWithDanglingToolCalls: (real) => (ids) => {
        reads++;
        return real(ids);
      },
    });
    const { service } = makeService(db.pool, { repo });
    expect(await settleInterruptedTails(service, [])).toBe(0);
    expect(reads).toBe(0);
    expect(await settleInterruptedTails(service, [randomUUID()])).toBe(0);
    expect(reads).toBe(1);
    await service.close();
  });
});
