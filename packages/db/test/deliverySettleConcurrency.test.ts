import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { asMessage, family, settle } from "./support/family.js";

const db = useTestDatabase();

/** Backends of this database waiting on a lock, with the statement each runs. */
async function lockWaits(): Promise<string[]> {
  const { rows } = await db.pool.query<{ query: string }>(
    `select query from pg_stat_activity
      where datname = current_database() and wait_event_type = 'Lock' and pid <> pg_backend_pid()`,
  );
  return rows.map((r) => r.query);
}

describe("a delivery into a parent's journal and its children's settlements", () => {
  it("a child's result is queued while a delivery into its parent's journal has not committed", async () => {
    const { r, account, parent, runs } = await family(db.pool, 2, "ds");
    const [first, second] = runs as [(typeof runs)[0], (typeof runs)[0]];
    const [anchor] = await r.append(parent.id, account.id, [
      { body: { type: "message", message: { role: "user", content: "go" } } },
    ]);
    const queued = await settle(r, first, "first");
    // Another transaction holds an uncommitted acknowledgement of the queued result: the delivery below
    // takes the parent's row lock, journals the result and then waits on that key, still in its transaction.
    const blocker = await db.pool.connect();
    try {
      await blocker.query("begin");
      await blocker.query(
        "insert into delegation_result_acks (result_id, parent_session_id, journal_seq) values ($1, $2, $3)",
        [queued, parent.id, anchor?.seq],
      );
      const delivery = r.deliverQueuedResults(parent.id, account.id, asMessage);
      await expect
        .poll(async () => (await lockWaits()).some((q) => q.includes("delegation_result_acks")))
        .toBe(true);

      // The child's settlement inserts into the parent's inbox (a foreign key to the parent's row): it must
      // not wait for the delivery to end.
      const timedOut = Symbol("timed out");
      const settled = await Promise.race([
        settle(r, second, "second"),
        new Promise((resolve) => setTimeout(() => resolve(timedOut), 5_000)),
      ]);
      expect(settled).not.toBe(timedOut);
      expect((await lockWaits()).some((q) => q.includes("delegation_result_acks"))).toBe(true);

      await blocker.query("rollback");
      const out = await delivery;
      expect(out.delivered.map((d) => d.resultId)).toEqual([queued]);
      // the result settled meanwhile waits for the next delivery
      const next = await r.deliverQueuedResults(parent.id, account.id, asMessage);
      expect(next.delivered.map((d) => d.resultId)).toEqual([settled]);
    } finally {
      await blocker.query("rollback").catch(() => undefined);
      blocker.release();
    }
  });
});
