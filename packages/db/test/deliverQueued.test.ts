import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { asMessage, inbox } from "./support/family.js";

const db = useTestDatabase();

const parentWithResults = (n: number) => inbox(db.pool, n, "dq");

describe("delivering whatever waits, read under the session's lock", () => {
  it("deliverers racing on one inbox deliver every result exactly once, in queue order", async () => {
    const { r, account, parent, ids } = await parentWithResults(10);
    const outs = await Promise.all(
      Array.from({ length: 5 }, () => r.deliverQueuedResults(parent.id, account.id, asMessage, { limit: 3 })),
    );
    const taken = outs.flatMap((o) => o.delivered.map((d) => d.resultId));
    // each call takes at most its limit, none takes what another took
    for (const o of outs) expect(o.delivered.length).toBeLessThanOrEqual(3);
    expect(new Set(taken).size).toBe(taken.length);
    // what is left is taken by one more call; then the inbox is empty
    const rest = await r.deliverQueuedResults(parent.id, account.id, asMessage);
    const all = [...taken, ...rest.delivered.map((d) => d.resultId)];
    expect([...all].sort()).toEqual([...ids].sort());
    expect((await r.deliverQueuedResults(parent.id, account.id, asMessage)).delivered).toEqual([]);
    // the journal holds each result once, in the order they settled
    const journal = await r.readJournal(parent.id, account.id);
    const inJournal = journal.flatMap((e) =>
      e.body.type === "message" && e.body.message.role === "custom" ? [e.body.message.details?.resultId] : [],
    );
    expect(inJournal).toEqual(ids);
    // results come back with their rows, matching `delivered` one for one
    for (const o of outs) expect(o.results.map((q) => q.id)).toEqual(o.delivered.map((d) => d.resultId));
  });

  it("a session that is not visible is refused with a typed error and nothing is delivered", async () => {
    const { r, account, parent } = await parentWithResults(1);
    await db.pool.query("update sessions set visibility = 'private' where id = $1", [parent.id]);
    await expect(r.deliverQueuedResults(parent.id, account.id, asMessage)).rejects.toMatchObject({
      code: "not_found",
    });
    const { rows } = await db.pool.query(
      "select 1 from delegation_result_acks where parent_session_id = $1",
      [parent.id],
    );
    expect(rows).toHaveLength(0);
  });

  it("a result's acknowledgement is mirrored on it by the delivery's statement, and only what is unacknowledged stays queued", async () => {
    const { r, account, parent, ids } = await parentWithResults(4);
    const mirror = async () => {
      const { rows } = await db.pool.query<{ id: string; acknowledged: boolean; acked: boolean }>(
        `select r.id, r.acknowledged,
                exists (select 1 from delegation_result_acks a where a.result_id = r.id) as acked
           from delegation_results r where r.parent_session_id = $1 order by r.queue_seq`,
        [parent.id],
      );
      return rows;
    };
    expect((await mirror()).map((m) => m.acknowledged)).toEqual([false, false, false, false]);
    await r.deliverResults(parent.id, account.id, [ids[1] as string], asMessage);
    await r.deliverQueuedResults(parent.id, account.id, asMessage, { limit: 2 });
    // the flag says what the acknowledgement rows say, result by result
    const after = await mirror();
    expect(after.map((m) => m.acknowledged)).toEqual(after.map((m) => m.acked));
    expect(after.map((m) => m.acknowledged)).toEqual([true, true, true, false]);
    expect(await r.queuedResultIds(parent.id, account.id)).toEqual([ids[3]]);
  });
});
