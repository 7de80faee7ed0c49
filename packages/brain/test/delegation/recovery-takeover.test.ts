import { randomUUID } from "node:crypto";
import type { PgDelegationRepository } from "@crw/db";
import { journalRows } from "@crw/tools/delegation";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  type DelegationEvent,
  type DelegationService,
  followUpQueued,
  idleRootParents,
  settleInterruptedTails,
  takeOverDelegations,
} from "../../src/index.js";
import {
  type Caller,
  deadOwnersRun,
  finished,
  gateTool,
  latch,
  makeService,
  messages,
  newParent,
  scriptTask,
  settledHelperResult,
  waitFor,
} from "./helpers.js";

/**
 * The live takeover's edges over real PostgreSQL, beyond takeover.test.ts: what a paused or idle pass
 * returns, the children's interrupted tails, the root parents it serves, a failure before any run is
 * recovered, and a run this process already drives.
 */
const db = useTestDatabase();

const nothing = {
  discardedForks: [],
  unknownToolCalls: 0,
  roots: [],
  handedBack: [],
  continued: [],
  settledWithoutTurn: [],
  terminalized: [],
  failed: [],
};

const lockedBy = async (id: string) =>
  (await db.pool.query("select locked_by from subagent_runs where id = $1", [id])).rows[0]?.locked_by;

/** A started service whose Gate tool stays shut until `gate` opens (or 15 s pass), and a root parent. */
async function gatedService() {
  const gates = new Map<string, Promise<void>>();
  const gate = latch();
  gates.set("k", gate.promise);
  const { service, repo } = makeService(db.pool, { tools: () => [gateTool("Gate", gates)] });
  await service.start();
  const caller = await newParent(service);
  return { service, repo, caller, gate };
}

/** A task whose turn waits at the gate, then answers `answer`. */
const gatedTask = (answer: string) =>
  scriptTask({ rounds: [[{ name: "Gate", arguments: { key: "k" } }]], answer });

/** Until the child is in its turn, held at the gate. */
async function inGatedTurn(service: DelegationService, childId: string, accountId: string) {
  await waitFor(
    async () =>
      messages(await service.repo.readJournal(childId, accountId)).some((m) => m.role === "assistant"),
    "the gated turn",
  );
}

/** Waits until the parent has taken every result queued for it, then closes the service. */
async function closeWhenDelivered(service: DelegationService, caller: Caller) {
  await waitFor(
    async () => (await service.repo.queuedResultIds(caller.parent.id, caller.account.id)).length === 0,
    "the delivery",
  );
  await service.whenIdle();
  await service.close();
}

describe("a takeover pass with nothing to do", () => {
  it("returns an empty report when no dead owner left work", async () => {
    const { service } = makeService(db.pool);
    await service.start();
    expect(await takeOverDelegations(service)).toEqual(nothing);
    await service.close();
  });

  it("a paused process takes nothing over: the dead owner's run stays as it was", async () => {
    const { service } = makeService(db.pool);
    await service.start();
    const caller = await newParent(service);
    const { run } = await deadOwnersRun(service, caller, scriptTask({ answer: "later" }));
    const before = await lockedBy(run.id);
    await service.pauseForRestart();
    expect(await takeOverDelegations(service)).toEqual(nothing);
    expect(await lockedBy(run.id)).toBe(before);
    await service.close();
    const next = makeService(db.pool);
    await next.service.start();
    expect((await takeOverDelegations(next.service)).continued).toEqual([run.id]);
    await finished(next.service, run.id, caller.account.id);
    await next.service.close();
  });
});

describe("what a takeover settles and serves", () => {
  it("answers the dead child's cut tool call and serves its root parent once for two runs", async () => {
    const events: DelegationEvent[] = [];
    const { service, repo } = makeService(db.pool, { onEvent: (e) => events.push(e) });
    await service.start();
    const caller = await newParent(service);
    const a = await deadOwnersRun(service, caller, scriptTask({ answer: "a done" }));
    const b = await deadOwnersRun(service, caller, scriptTask({ answer: "b done" }));
    await repo.append(a.child.id, caller.account.id, [
      journalRows.user("task a"),
      journalRows.asking("x-1"),
      journalRows.intent("x-1"),
    ]);
    const report = await takeOverDelegations(service);
    expect(report.roots).toEqual([caller.parent.id]);
    expect(report.unknownToolCalls).toBe(1);
    expect(report.continued.slice().sort()).toEqual([a.run.id, b.run.id].sort());
    expect(report.handedBack).toEqual([]);
    for (const id of [a.run.id, b.run.id])
      expect(events).toContainEqual({ type: "delegation.recovered", runId: id, action: "continued" });
    await finished(service, a.run.id, caller.account.id);
    await finished(service, b.run.id, caller.account.id);
    const childMsgs = messages(await repo.readJournal(a.child.id, caller.account.id));
    expect(childMsgs.filter((m) => m.role === "toolResult" && m.toolCallId === "x-1")).toHaveLength(1);
    // the cut call was of unknown outcome: that continuation was charged
    expect((await repo.getRun(a.run.id, caller.account.id)).recoveryAttempts).toBe(1);
    await closeWhenDelivered(service, caller);
  });

  it("serves no parent that is not a root, nor a root whose turn this process holds", async () => {
    const { service } = makeService(db.pool);
    await service.start();
    const caller = await newParent(service);
    const { run, child } = await deadOwnersRun(service, caller, scriptTask({ answer: "mid" }));
    // a grandchild: its parent is the delegated child
    const grandchild = await deadOwnersRun(service, { parent: child, account: caller.account }, "leaf");
    const report = await takeOverDelegations(service);
    expect(report.roots).toEqual([caller.parent.id]);
    const both = [run, grandchild.run].map((r) => ({
      parentSessionId: r.parentSessionId,
      principalAccountId: r.principalAccountId,
    }));
    expect((await idleRootParents(service, both)).map((s) => s.id)).toEqual([caller.parent.id]);
    const held = await service.turns.exclusive(caller.parent.id, () => idleRootParents(service, both));
    expect(held).toEqual([]);
    await finished(service, run.id, caller.account.id);
    await closeWhenDelivered(service, caller);
  });

  it("settles no tails when asked for none, and follows up only roots with results waiting", async () => {
    const { service, repo } = makeService(db.pool);
    const caller = await newParent(service);
    await repo.append(caller.parent.id, caller.account.id, [
      journalRows.asking("w1"),
      journalRows.intent("w1"),
    ]);
    expect(await settleInterruptedTails(service, [])).toBe(0);
    expect(messages(await repo.readJournal(caller.parent.id, caller.account.id))).toHaveLength(1);
    const parent = await repo.getSession(caller.parent.id, caller.account.id);
    await followUpQueued(service, [parent]);
    await service.whenIdle();
    expect(messages(await repo.readJournal(caller.parent.id, caller.account.id))).toHaveLength(1);
    expect(await settleInterruptedTails(service, [caller.parent.id])).toBe(1);
    await service.close();
  });
});

describe("a takeover that cannot go on", () => {
  it("hands every claimed run back when the tails cannot be settled, and says why", async () => {
    const events: DelegationEvent[] = [];
    const { repo: real } = makeService(db.pool);
    let fail = true;
    const repo = new Proxy(real, {
      get(t, key, receiver) {
        const value = Reflect.get(t, key, receiver) as unknown;
        if (key !== "sessionsWithDanglingToolCalls" || typeof value !== "function") return value;
        return (...args: unknown[]) => {
          if (fail) {
            fail = false;
            return Promise.reject(new Error("connection terminated unexpectedly"));
          }
          return (value as (...a: unknown[]) => unknown).apply(t, args);
        };
      },
    });
    const { service } = makeService(db.pool, { repo, onEvent: (e) => events.push(e) });
    await service.start();
    const caller = await newParent(service);
    const a = await deadOwnersRun(service, caller, scriptTask({ answer: "a" }));
    const b = await deadOwnersRun(service, caller, scriptTask({ answer: "b" }));
    const report = await takeOverDelegations(service);
    expect(report).toEqual({ ...nothing, handedBack: [a.run.id, b.run.id] });
    for (const run of [a.run, b.run]) {
      expect(await lockedBy(run.id)).toBe(`${service.owner}:handed-back`);
      expect(events).toContainEqual({
        type: "delegation.recovered",
        runId: run.id,
        action: "handed_back",
        error: "connection terminated unexpectedly",
      });
    }
    const again = await takeOverDelegations(service);
    expect(again.continued.slice().sort()).toEqual([a.run.id, b.run.id].sort());
    await finished(service, a.run.id, caller.account.id);
    await finished(service, b.run.id, caller.account.id);
    await service.close();
  });

  it("a hand-back that fails too leaves the run leased here and the pass still returns", async () => {
    const { repo: real } = makeService(db.pool);
    const repo = new Proxy(real, {
      get(t, key, receiver) {
        const value = Reflect.get(t, key, receiver) as unknown;
        if (
          key === "readJournal" ||
          key === "readJournalTail" ||
          key === "journalTailWithWork" ||
          key === "journalTailsWithWork" ||
          key === "handBackRun"
        )
          return () => Promise.reject(new Error("connection terminated unexpectedly"));
        return value;
      },
    }) as PgDelegationRepository;
    const { service } = makeService(db.pool, { repo });
    await service.start();
    const caller = await newParent(service);
    const { run } = await deadOwnersRun(service, caller, scriptTask({ answer: "x" }));
    const report = await takeOverDelegations(service);
    expect(report.handedBack).toEqual([run.id]);
    expect(await lockedBy(run.id)).toBe(service.owner);
    await service.close();
    const next = makeService(db.pool);
    await next.service.start();
    expect((await takeOverDelegations(next.service)).continued).toEqual([run.id]);
    await finished(next.service, run.id, caller.account.id);
    await next.service.close();
  });

  it("a run this process drives already is not started a second time", async () => {
    const { service, repo, caller, gate } = await gatedService();
    const { run, child } = await deadOwnersRun(service, caller, gatedTask("once"));
    expect((await takeOverDelegations(service)).continued).toEqual([run.id]);
    // its child waits in the gate; meanwhile the row comes to name a dead owner again
    await inGatedTurn(service, child.id, caller.account.id);
    await db.pool.query("update subagent_runs set locked_by = $2 where id = $1", [
      run.id,
      `dead-${randomUUID()}`,
    ]);
    expect(await takeOverDelegations(service)).toEqual(nothing);
    gate.open();
    await finished(service, run.id, caller.account.id);
    const after = await repo.getRun(run.id, caller.account.id);
    expect(after).toMatchObject({ status: "succeeded", generation: 2 });
    const answers = messages(await repo.readJournal(child.id, caller.account.id)).filter(
      (m) => m.role === "assistant" && JSON.stringify(m).includes("once"),
    );
    expect(answers).toHaveLength(1);
    await closeWhenDelivered(service, caller);
  });
});

describe("what a takeover claims", () => {
  it("claims no more runs a pass than its claim batch, the oldest first", async () => {
    const { service } = makeService(db.pool);
    await service.start();
    const caller = await newParent(service);
    const a = await deadOwnersRun(service, caller, scriptTask({ answer: "a" }));
    const b = await deadOwnersRun(service, caller, scriptTask({ answer: "b" }));
    const lease = await lockedBy(b.run.id);
    expect((await takeOverDelegations(service, { claimBatch: 1 })).continued).toEqual([a.run.id]);
    expect(await lockedBy(b.run.id)).toBe(lease);
    expect((await takeOverDelegations(service, { claimBatch: 1 })).continued).toEqual([b.run.id]);
    await finished(service, a.run.id, caller.account.id);
    await finished(service, b.run.id, caller.account.id);
    await closeWhenDelivered(service, caller);
  });

  it("a run whose unfinished fork copy a dying boot had discarded ends with its error result, not handed back", async () => {
    const { service, repo } = makeService(db.pool);
    await service.start();
    const caller = await newParent(service);
    const { run, child } = await deadOwnersRun(service, caller, scriptTask({ answer: "never" }), {
      fork: true,
    });
    // that boot discarded the copy, then died before it claimed anything: the run has no child now
    expect(await repo.discardPrivateSessions([child.id])).toEqual([child.id]);
    const report = await takeOverDelegations(service);
    expect(report).toMatchObject({ terminalized: [run.id], handedBack: [], discardedForks: [] });
    expect(await repo.getRun(run.id, caller.account.id)).toMatchObject({
      status: "failed",
      childSessionId: null,
    });
    await closeWhenDelivered(service, caller);
  });

  it("follows up a root parent whose result was waiting already, before the run it took has ended", async () => {
    const { service, repo, caller, gate } = await gatedService();
    const scope = JSON.stringify({ accountId: caller.account.id, target: { kind: "host", ref: null } });
    await settledHelperResult(
      repo,
      { id: caller.parent.id, scope },
      caller.account.id,
      "early",
      "early news",
    );
    const { run } = await deadOwnersRun(service, caller, gatedTask("late news"));
    expect((await takeOverDelegations(service)).roots).toEqual([caller.parent.id]);
    // The child waits at the shut gate (it opens by itself after 15 s): only the pass's own follow-up
    // delivers the waiting result before then.
    await waitFor(
      async () => (await repo.queuedResultIds(caller.parent.id, caller.account.id)).length === 0,
      "the waiting result's delivery",
      10_000,
    );
    const msgs = messages(await repo.readJournal(caller.parent.id, caller.account.id));
    expect(msgs.some((m) => m.role === "custom" && m.content.includes("early news"))).toBe(true);
    gate.open();
    await finished(service, run.id, caller.account.id);
    await waitFor(
      async () => (await repo.queuedResultIds(caller.parent.id, caller.account.id)).length === 0,
      "the late delivery",
    );
    await service.whenIdle();
    await service.close();
  });

  it("a run whose execution here has ended is taken again when its lease names a dead owner", async () => {
    const { service, caller, gate } = await gatedService();
    const { run, child } = await deadOwnersRun(service, caller, gatedTask("twice"));
    expect((await takeOverDelegations(service)).continued).toEqual([run.id]);
    await inGatedTurn(service, child.id, caller.account.id);
    // another process moved the call on meanwhile and died: this execution's settlement is fenced out
    await db.pool.query(
      "update subagent_runs set generation = generation + 1, locked_by = $2 where id = $1",
      [run.id, `dead-${randomUUID()}`],
    );
    gate.open();
    await service.whenIdle();
    const again = await takeOverDelegations(service);
    expect([...again.continued, ...again.settledWithoutTurn]).toEqual([run.id]);
    await finished(service, run.id, caller.account.id);
    await closeWhenDelivered(service, caller);
  });
});
