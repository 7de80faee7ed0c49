import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { type DelegationDbError, PgDelegationRepository, type QueuedResult } from "../src/index.js";
import { asMessage, family as familyOf, settle } from "./support/family.js";

const db = useTestDatabase();
const repo = () => new PgDelegationRepository(db.pool);

const family = (children = 1) => familyOf(db.pool, children, "acct");

/**
 * A repository whose every pooled connection records the statements sent on it (their first four words):
 * `issued` holds one list per connection taken, in the order they were taken. `sent` and `done` hear each
 * statement as it is sent and once it has answered.
 */
function spying(hear: { sent?: (q: string) => void; done?: (q: string) => void } = {}) {
  const issued: string[][] = [];
  const spy = new PgDelegationRepository(
    new Proxy(db.pool, {
      get(target, key) {
        if (key !== "connect") return Reflect.get(target, key);
        return async () => {
          const client = await target.connect();
          const mine: string[] = [];
          issued.push(mine);
          return new Proxy(client, {
            get(c, k) {
              if (k !== "query") return Reflect.get(c, k);
              return async (text: string, values?: unknown[]) => {
                const q = text.trim().split(/\s+/).slice(0, 4).join(" ");
                mine.push(q);
                hear.sent?.(q);
                const out = await c.query(text, values);
                hear.done?.(q);
                return out;
              };
            },
          });
        };
      },
    }),
  );
  return { spy, issued };
}

describe("DelegationRepository on PostgreSQL", () => {
  it("a result's journal entry and its acknowledgement commit together or not at all (S004-025)", async () => {
    const { r, account, parent, runs } = await family(1);
    const id = await settle(r, runs[0] as never);
    await expect(
      r.deliverResults(parent.id, account.id, [id], asMessage, {
        probe: () => {
          throw new Error("crash between append and ack");
        },
      }),
    ).rejects.toThrow(/crash between/);
    expect(await r.readJournal(parent.id, account.id)).toHaveLength(0);
    expect(await r.queuedResultIds(parent.id, account.id)).toEqual([id]);

    const out = await r.deliverResults(parent.id, account.id, [id], asMessage);
    expect(out.delivered.map((d) => d.resultId)).toEqual([id]);
    expect(await r.queuedResultIds(parent.id, account.id)).toEqual([]);
    const journal = await r.readJournal(parent.id, account.id);
    expect(journal).toHaveLength(1);
    expect(journal[0]?.body).toMatchObject({ type: "message", message: { details: { resultId: id } } });
  });

  it("delivery is exactly once when many deliverers race; a committed result is never delivered again (S004-043)", async () => {
    const { r, account, parent, runs } = await family(12);
    const ids = await Promise.all(runs.map((run) => settle(r, run)));
    const outs = await Promise.all(
      Array.from({ length: 8 }, () => r.deliverResults(parent.id, account.id, ids, asMessage)),
    );
    const delivered = outs.flatMap((o) => o.delivered.map((d) => d.resultId));
    expect(delivered.sort()).toEqual([...ids].sort());
    const settled = await r.settledResultIds(parent.id, account.id);
    expect(settled.sort()).toEqual([...ids].sort());
    expect(new Set(settled).size).toBe(settled.length);
    // Once committed, neither the steering drain (whatever waits) nor a deliverer naming them takes one again.
    expect(await r.deliverQueuedResults(parent.id, account.id, asMessage)).toEqual({
      delivered: [],
      results: [],
    });
    expect(await r.deliverResults(parent.id, account.id, ids, asMessage)).toEqual({
      delivered: [],
      skipped: ids,
    });
    expect(await r.readJournal(parent.id, account.id)).toHaveLength(ids.length);
  });

  it("settledResultIds comes from settled, undiscarded entries carrying details.resultId (S004-023)", async () => {
    const { r, account, parent, runs } = await family(3);
    const [a, b, c] = [
      await settle(r, runs[0] as never),
      await settle(r, runs[1] as never),
      await settle(r, runs[2] as never),
    ];
    await r.deliverResults(parent.id, account.id, [a], asMessage);
    // b is in the journal only provisionally (a turn still streaming), then discarded by recovery
    await r.append(parent.id, account.id, [
      {
        body: { type: "message", message: asMessage({ id: b, body: "x" } as QueuedResult) },
        settled: false,
      },
    ]);
    expect(await r.settledResultIds(parent.id, account.id)).toEqual([a]);
    await r.settleProvisional(parent.id, account.id, "discarded");
    expect(await r.settledResultIds(parent.id, account.id)).toEqual([a]);
    await r.deliverResults(parent.id, account.id, [c, b], asMessage);
    expect(await r.settledResultIds(parent.id, account.id)).toEqual([a, b, c]);
  });

  it("settledResultIds still counts results delivered before a compaction (S004-024)", async () => {
    const { r, account, parent, runs } = await family(2);
    const first = await settle(r, runs[0] as never);
    await r.deliverResults(parent.id, account.id, [first], asMessage);
    const [mark] = await r.append(parent.id, account.id, [
      { body: { type: "message", message: { role: "user", content: "more" } } },
    ]);
    await r.append(parent.id, account.id, [
      { body: { type: "compaction", summary: "earlier work", firstKeptSeq: mark?.seq ?? 1 } },
    ]);
    const second = await settle(r, runs[1] as never);
    await r.deliverResults(parent.id, account.id, [second], asMessage);
    expect(await r.settledResultIds(parent.id, account.id)).toEqual([first, second]);
  });

  it("the read decodes the original JSON and refuses a malformed row instead of skipping it (S004-035)", async () => {
    const { r, account, parent } = await family(0);
    await db.pool.query(
      `insert into journal_entries (session_id, seq, kind, body) values ($1, 1, 'custom_message', '{"type":"message"')`,
      [parent.id],
    );
    await expect(r.settledResultIds(parent.id, account.id)).rejects.toMatchObject({
      code: "malformed_entry",
    });
  });

  it("queuedResultIds is FIFO in settle order and scoped by parent and principal (S004-159)", async () => {
    const { r, account, parent, runs } = await family(4);
    const ids: string[] = [];
    for (const run of [runs[2], runs[0], runs[3], runs[1]]) ids.push(await settle(r, run as never));
    expect(await r.queuedResultIds(parent.id, account.id)).toEqual(ids);
    // another parent of the same account: each parent's queue holds only its own children's results
    const sibling = await r.createRootSession(account.id, "scripted");
    const { run } = await r.createDelegation({
      parentSessionId: sibling.id,
      principalAccountId: account.id,
      toolCallId: "call-s",
      task: "sibling's task",
      mode: "background",
      model: "scripted",
      scope: "{}",
    });
    const siblings = await settle(r, run);
    expect(await r.queuedResultIds(parent.id, account.id)).toEqual(ids);
    expect(await r.queuedResultIds(sibling.id, account.id)).toEqual([siblings]);
    const other = await r.createAccount({ name: `other-${randomUUID()}` });
    await expect(r.queuedResultIds(parent.id, other.id)).resolves.toEqual([]);
    await expect(r.readJournal(parent.id, other.id)).rejects.toMatchObject({ code: "not_found" });
  });

  it("refuses a malformed journal entry with a typed error and writes nothing", async () => {
    const { r, account, parent } = await family(0);
    const bad = { type: "message", message: { role: "assistant", content: "not an array" } } as never;
    await expect(
      r.append(parent.id, account.id, [
        { body: { type: "message", message: { role: "user", content: "ok" } } },
        { body: bad },
      ]),
    ).rejects.toMatchObject({ code: "malformed_entry" });
    expect(await r.readJournal(parent.id, account.id)).toEqual([]);
  });

  it("refuses a cross-account parent link with a typed error and writes nothing", async () => {
    const { r, parent } = await family(0);
    const intruder = await r.createAccount({ name: `intruder-${randomUUID()}` });
    const err = (await r
      .createDelegation({
        parentSessionId: parent.id,
        principalAccountId: intruder.id,
        toolCallId: "x",
        task: "t",
        mode: "foreground",
        model: "scripted",
        scope: "{}",
      })
      .catch((e: unknown) => e)) as DelegationDbError;
    expect(err.code).toBe("cross_account");
    const { rowCount } = await db.pool.query("select 1 from sessions where principal_account_id = $1", [
      intruder.id,
    ]);
    expect(rowCount).toBe(0);
  });

  it("the same Delegate tool call never creates a second child; a child has at most one open call", async () => {
    const { r, account, parent, runs } = await family(1);
    const run = runs[0];
    if (!run?.childSessionId) throw new Error("no child");
    const again = await r.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "call-0",
      task: "task 0",
      mode: "background",
      model: "scripted",
      scope: "{}",
    });
    expect(again.created).toBe(false);
    expect(again.run.id).toBe(run.id);
    await expect(
      r.createContinuation({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        childSessionId: run.childSessionId,
        toolCallId: "call-1",
        task: "more",
        mode: "foreground",
        readOnlyScope: null,
      }),
    ).rejects.toMatchObject({ code: "conflict", context: { reason: "child_busy" } });
  });

  it("settling a run twice writes one result; a stale generation is refused", async () => {
    const { r, runs } = await family(1);
    const run = runs[0] as never as { id: string; generation: number };
    const first = await settle(r, run);
    const second = await r.settleRun({
      runId: run.id,
      generation: run.generation,
      resultId: randomUUID(),
      outcome: "ok",
      body: "again",
      byteSize: 5,
    });
    expect(second).toEqual({ settled: false, resultId: first });
  });

  it("a live owner's runs cannot be claimed; a dead owner's can", async () => {
    const { r, runs } = await family(2);
    const live = `live-${randomUUID()}`;
    const release = await r.holdOwnerLease(live);
    const [a, b] = runs as [never, never] as [
      { id: string; generation: number },
      { id: string; generation: number },
    ];
    expect(await r.markRunStarted(a.id, a.generation, live)).toBe(true);
    expect(await r.markRunStarted(b.id, b.generation, "dead-owner")).toBe(true);
    const claimed = await r.claimOpenRuns(`rec-${randomUUID()}`, 100);
    expect(claimed.map((c) => c.id)).toContain(b.id);
    expect(claimed.map((c) => c.id)).not.toContain(a.id);
    await release();
    const later = await r.claimOpenRuns(`rec2-${randomUUID()}`, 100);
    expect(later.map((c) => c.id)).toContain(a.id);
  });

  it("a private fork copy is absent from every session reader and from its parent's children until it commits (S004-246)", async () => {
    const { r, account, parent } = await family(0);
    await r.append(parent.id, account.id, [
      { body: { type: "message", message: { role: "user", content: "context" } } },
      {
        body: {
          type: "message",
          message: { role: "assistant", content: [{ type: "text", text: "ok" }], stopReason: "stop" },
        },
      },
    ]);
    const fork = await r.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "fork-1",
      task: "forked",
      mode: "background",
      model: "scripted",
      scope: "{}",
      fork: { fromSessionId: parent.id },
    });
    expect(await r.copyJournalBranch(parent.id, fork.child.id, account.id, 2)).toBe(2);
    const child = fork.child.id;
    // Every reader of a session: its transcript (usage-bearing replies included), its ownership, and the
    // parent's listing of its children.
    const readers: [string, () => Promise<unknown>][] = [
      ["getSession", () => r.getSession(child, account.id)],
      ["getSessionWithAccount", () => r.getSessionWithAccount(child, account.id)],
      ["getChildSession", () => r.getChildSession(parent.id, child, account.id)],
      ["readJournal", () => r.readJournal(child, account.id)],
      ["readJournalTail", () => r.readJournalTail(child, account.id)],
      ["readJournalAfter", () => r.readJournalAfter(child, account.id, 0)],
      ["latestTurn", () => r.latestTurn(child, account.id)],
      ["recentAssistantMessages", () => r.recentAssistantMessages(child, account.id, 32)],
      ["settledResultIds", () => r.settledResultIds(child, account.id)],
    ];
    for (const [name, read] of readers)
      await expect(read(), name).rejects.toMatchObject({ code: "not_found" });
    expect((await r.childrenOf(parent.id, account.id)).map((c) => c.child.id)).not.toContain(child);
    await r.commitFork(child, account.id);
    // Committed, the same readers see it.
    for (const [name, read] of readers) await expect(read(), name).resolves.toBeDefined();
    expect(await r.readJournal(child, account.id)).toHaveLength(2);
    expect((await r.childrenOf(parent.id, account.id)).map((c) => c.child.id)).toContain(child);
  });

  it("a fork's copied context keeps the parent's result ids in its JSON but they are not its deliveries", async () => {
    const { r, account, parent, runs } = await family(1);
    const inherited = await settle(r, runs[0] as never);
    await r.deliverResults(parent.id, account.id, [inherited], asMessage);
    const fork = await r.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "fork-ids",
      task: "forked",
      mode: "background",
      model: "scripted",
      scope: "{}",
      fork: { fromSessionId: parent.id },
    });
    expect(await r.copyJournalBranch(parent.id, fork.child.id, account.id, 1)).toBe(1);
    await r.commitFork(fork.child.id, account.id);
    const copied = await r.readJournal(fork.child.id, account.id);
    // The copy is the parent's context byte for byte, details.resultId included ...
    expect(copied[0]?.body).toMatchObject({ message: { details: { resultId: inherited } } });
    // ... but the result was delivered to the parent, not to the fork.
    expect(await r.settledResultIds(fork.child.id, account.id)).toEqual([]);
    expect(await r.settledResultIds(parent.id, account.id)).toEqual([inherited]);
    // A result the fork's own helper delivers to it is the fork's delivery.
    const helper = await r.createDelegation({
      parentSessionId: fork.child.id,
      principalAccountId: account.id,
      toolCallId: "helper-1",
      task: "help",
      mode: "background",
      model: "scripted",
      scope: "{}",
    });
    const own = await settle(r, helper.run);
    await r.deliverResults(fork.child.id, account.id, [own], asMessage);
    expect(await r.settledResultIds(fork.child.id, account.id)).toEqual([own]);
  });

  it("a progress update writes only the progress columns, in seq order, of an open row of its generation (S004-219)", async () => {
    const { r, account, parent, runs } = await family(1);
    const run = runs[0];
    if (!run?.childSessionId) throw new Error("expected a run");
    await settle(r, run as never);
    const cont = await r.createContinuation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: run.childSessionId,
      toolCallId: "cont-1",
      task: "look",
      mode: "foreground",
      readOnlyScope: '{"readOnly":true}',
    });
    const before = (await db.pool.query("select * from subagent_runs where id = $1", [cont.run.id])).rows[0];
    expect(await r.recordRunProgress(cont.run.id, account.id, 1, 2, '{"seq":2}')).toBe(true);
    expect(await r.recordRunProgress(cont.run.id, account.id, 1, 1, '{"seq":1}')).toBe(false);
    expect(await r.recordRunProgress(cont.run.id, account.id, 2, 3, '{"seq":3}')).toBe(false);
    const other = await r.createAccount({ name: `other-${randomUUID()}` });
    expect(await r.recordRunProgress(cont.run.id, other.id, 1, 4, '{"seq":4}')).toBe(false);
    await expect(r.recordRunProgress(cont.run.id, account.id, 1, 0, "{}")).rejects.toMatchObject({
      code: "invalid_input",
    });
    const after = (await db.pool.query("select * from subagent_runs where id = $1", [cont.run.id])).rows[0];
    const { progress, progress_seq, ...rest } = after as Record<string, unknown>;
    const { progress: _p, progress_seq: _s, ...restBefore } = before as Record<string, unknown>;
    expect(rest).toEqual(restBefore);
    expect([progress, progress_seq]).toEqual(['{"seq":2}', 2]);
    expect((await r.getRun(cont.run.id, account.id)).readOnlyScope).toBe('{"readOnly":true}');
    // Ctrl+B: an open foreground row becomes a background row; a terminal row does not move.
    expect(await r.moveRunToBackground(cont.run.id, account.id, 1)).toBe(true);
    expect((await r.getRun(cont.run.id, account.id)).mode).toBe("background");
    expect(await r.moveRunToBackground(run.id, account.id, run.generation)).toBe(false);
    await settle(r, cont.run as never);
    expect(await r.recordRunProgress(cont.run.id, account.id, 1, 9, '{"seq":9}')).toBe(false);
  });

  it("discarding private sessions removes an unfinished fork copy and leaves its run queued with no child", async () => {
    const { r, account, parent } = await family(0);
    const fork = await r.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "fork-2",
      task: "forked",
      mode: "background",
      model: "scripted",
      scope: "{}",
      fork: { fromSessionId: parent.id },
    });
    const discarded = await r.discardPrivateSessions();
    expect(discarded).toContain(fork.child.id);
    const run = await r.getRun(fork.run.id, account.id);
    expect(run.childSessionId).toBeNull();
    expect(run.status).toBe("queued");
  });

  it("every DelegationRepository operation is asynchronous: it returns a promise and never throws synchronously; bad ids reject (S004-158)", async () => {
    const r = repo();
    const bad = "not-a-uuid";
    const calls: Array<() => Promise<unknown>> = [
      () => r.getAccount(bad),
      () => r.getSession(bad, bad),
      () => r.getChildSession(bad, bad, bad),
      () => r.readJournal(bad, bad),
      () => r.append(bad, bad, [{ body: { type: "message", message: { role: "user", content: "x" } } }]),
      () => r.settledResultIds(bad, bad),
      () => r.queuedResultIds(bad, bad),
      () => r.deliverResults(bad, bad, [bad], asMessage),
      () =>
        r.createDelegation({
          parentSessionId: bad,
          principalAccountId: bad,
          toolCallId: "t",
          task: "t",
          mode: "foreground",
          model: "m",
          scope: "{}",
        }),
      () => r.settleRun({ runId: bad, generation: 1, resultId: bad, outcome: "ok", body: "", byteSize: 0 }),
      () => r.enqueueSteer(bad, bad, "x"),
      () => r.startRun(bad, 1, "o"),
    ];
    for (const call of calls) {
      let promise: Promise<unknown> | undefined;
      expect(() => {
        promise = call();
      }).not.toThrow();
      await expect(promise).rejects.toMatchObject({ code: "invalid_input" });
    }
    // Every operation the repository has, given ids that are not ids: a promise, never a synchronous throw.
    const all = r as unknown as Record<string, unknown>;
    const operations = Object.keys(all).filter((k) => typeof all[k] === "function");
    expect(operations.length).toBeGreaterThan(70);
    for (const name of operations) {
      const operation = all[name] as (...args: unknown[]) => unknown;
      let out: unknown;
      expect(() => {
        out = operation(...Array.from({ length: Math.max(operation.length, 1) }, () => bad));
      }, name).not.toThrow();
      expect(out, name).toBeInstanceOf(Promise);
      const settled = await (out as Promise<unknown>).catch(() => undefined);
      // an owner lease taken for the bad owner name is given back
      if (typeof settled === "function") await (settled as () => Promise<void>)();
    }
  });

  it("a fork's context is copied in batches that yield, each admitted as the private copy's writer in its own transaction, while the source journal keeps taking writes (S004-245)", async () => {
    const { r, account, parent } = await family(0);
    const rows = 450;
    await r.append(
      parent.id,
      account.id,
      Array.from({ length: rows }, (_, i) => ({
        body: { type: "message" as const, message: { role: "user" as const, content: `m${i}` } },
      })),
    );
    const fork = await r.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "big-fork",
      task: "t",
      mode: "background",
      model: "scripted",
      scope: "{}",
      fork: { fromSessionId: parent.id },
    });
    // A turn of the event loop is queued as each batch commits: it runs before the next batch begins only
    // when the copy yields between batches.
    const order: string[] = [];
    const { spy, issued } = spying({
      sent: (q) => q.startsWith("begin") && order.push("batch"),
      done: (q) => q === "commit" && setImmediate(() => order.push("loop turn")),
    });
    // Another writer holds the private copy's row: the copy waits to be admitted, and meanwhile the source
    // journal takes writes.
    const holder = await db.pool.connect();
    await holder.query("begin");
    await holder.query("select 1 from sessions where id = $1::uuid for update", [fork.child.id]);
    const copying = spy.copyJournalBranch(parent.id, fork.child.id, account.id, rows);
    let finished = false;
    void copying.finally(() => {
      finished = true;
    });
    for (let waiting = 0; waiting === 0 && !finished; ) {
      const { rowCount } = await db.pool.query(
        "select 1 from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'",
      );
      waiting = rowCount ?? 0;
    }
    expect(finished).toBe(false);
    for (let i = 0; i < 5; i++)
      await r.append(parent.id, account.id, [
        { body: { type: "message", message: { role: "user", content: `late ${i}` } } },
      ]);
    const early = await db.pool.query("select 1 from journal_entries where session_id = $1::uuid", [
      fork.child.id,
    ]);
    expect(early.rowCount).toBe(0);
    await holder.query("commit");
    holder.release();
    const copied = await copying;
    expect(copied).toBe(rows);
    // Batches of 200 rows, each its own short transaction that locks only the private copy: the source's
    // writers are never held for the length of the copy.
    expect(issued).toHaveLength(3);
    expect(order.slice(0, 5)).toEqual(["batch", "loop turn", "batch", "loop turn", "batch"]);
    for (const statements of issued) {
      expect(statements[0]).toMatch(/^begin/);
      expect(statements.filter((q) => q.startsWith("insert into journal_entries"))).toHaveLength(1);
      expect(statements.at(-1)).toBe("commit");
    }
    await r.commitFork(fork.child.id, account.id);
    const copy = await r.readJournal(fork.child.id, account.id);
    expect(copy.map((e) => e.seq)).toEqual(Array.from({ length: rows }, (_, i) => i + 1));
    expect((await r.readJournal(parent.id, account.id)).length).toBe(rows + 5);
  });

  it("refuses a journal whose ancestry has a cycle", async () => {
    const { r, account, parent, runs } = await family(1);
    const child = runs[0]?.childSessionId ?? "";
    await db.pool.query("alter table sessions disable trigger all");
    await db.pool.query(
      "update sessions set parent_session_id = $1, kind = 'delegated', scope = '{}' where id = $2",
      [child, parent.id],
    );
    await db.pool.query("alter table sessions enable trigger all");
    await expect(r.ancestry(child, account.id)).rejects.toMatchObject({ code: "invalid_input" });
  });

  it("settledResultIds reads in one repeatable-read, read-only snapshot (S004-034)", async () => {
    const { r, account, parent, runs } = await family(1);
    const id = await settle(r, runs[0] as never);
    await r.deliverResults(parent.id, account.id, [id], asMessage);
    const { spy, issued } = spying();
    expect(await spy.settledResultIds(parent.id, account.id)).toEqual([id]);
    expect(issued).toHaveLength(1);
    expect(issued[0]?.[0]).toBe("begin isolation level repeatable");
    expect(issued[0]?.filter((q) => q.startsWith("select"))).toHaveLength(2);
    expect(issued[0]?.at(-1)).toBe("commit");
  });
});
