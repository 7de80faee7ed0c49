import { randomUUID } from "node:crypto";
import type { DelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { latch, makeService, newParent, waitFor } from "./helpers.js";

const db = useTestDatabase();

describe("a result that lands while an idle parent's follow-up holds its turn lock", () => {
  it("is delivered once the follow-up lets go, not left queued until a restart", async () => {
    const { repo: real } = makeService(db.pool);
    // The follow-up's read of the parent's inbox (empty) is held open: the result commits after it, while
    // the follow-up still holds the parent's turn lock.
    let hold: { read: ReturnType<typeof latch>; go: ReturnType<typeof latch> } | undefined;
    const repo = new Proxy(real, {
      get(target, key, receiver) {
        const value = Reflect.get(target, key, receiver) as unknown;
        if (key !== "deliverQueuedResults" || typeof value !== "function") return value;
        return async (...args: unknown[]) => {
          const out = await (value as (...a: unknown[]) => Promise<{ delivered: unknown[] }>).apply(
            target,
            args,
          );
          const held = hold;
          if (held && out.delivered.length === 0) {
            hold = undefined;
            held.read.open();
            await held.go.promise;
          }
          return out;
        };
      },
    }) as DelegationRepository;
    const { service } = makeService(db.pool, { repo });
    const { account, parent } = await newParent(service);
    const { run } = await repo.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: `t-${randomUUID()}`,
      task: "done elsewhere",
      mode: "background",
      model: "scripted",
      scope: JSON.stringify({ accountId: account.id, target: { kind: "host", ref: null } }),
    });
    hold = { read: latch(), go: latch() };
    const held = hold;
    const followUp = service.followUp(parent);
    await held.read.promise;
    // the call settles now: its parent is busy (the follow-up holds the lock), so it is left to the holder
    await repo.startRun(run.id, run.generation, service.owner);
    const { resultId } = await repo.settleRun({
      runId: run.id,
      generation: run.generation,
      resultId: randomUUID(),
      outcome: "ok",
      body: "late result",
      byteSize: 11,
    });
    await service.resultQueued(parent.id, account.id, resultId);
    held.go.open();
    expect(await followUp).toBeUndefined();
    await waitFor(
      async () => (await repo.settledResultIds(parent.id, account.id)).includes(resultId),
      "the late result delivered",
      5_000,
    );
    await service.whenIdle();
    await service.close();
  });
});
