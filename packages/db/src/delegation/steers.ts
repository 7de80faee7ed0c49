import type pg from "pg";
import { DelegationDbError } from "../errors.js";
import type { SteerReceipt } from "../repositories/delegation.js";
import { tx } from "../tx.js";
import { appendIn, assertVisible } from "./journal.js";
import { assertUuid, type Row, steerFromRow } from "./rows.js";

export async function enqueueSteer(
  pool: pg.Pool,
  childSessionId: string,
  principalAccountId: string,
  text: string,
): Promise<SteerReceipt> {
  assertUuid("childSessionId", childSessionId);
  if (text.length < 1 || text.length > 100_000) {
    throw new DelegationDbError("invalid_input", "a steer is 1..100000 characters", {});
  }
  return tx(pool, async (c) => {
    await assertVisible(c, childSessionId, principalAccountId);
    const { rows } = await c.query<Row>(
      `insert into delegated_steers (child_session_id, principal_account_id, text) values ($1::uuid, $2::uuid, $3)
       returning *`,
      [childSessionId, principalAccountId, text],
    );
    return steerFromRow(rows[0] as Row);
  });
}

export async function pendingSteers(
  pool: pg.Pool,
  childSessionId: string,
  principalAccountId: string,
): Promise<SteerReceipt[]> {
  assertUuid("childSessionId", childSessionId);
  const { rows } = await pool.query<Row>(
    `select * from delegated_steers where child_session_id = $1::uuid and principal_account_id = $2::uuid
        and status = 'pending' order by created_at, id`,
    [childSessionId, principalAccountId],
  );
  return rows.map(steerFromRow);
}

/** The steers' user messages enter the child's journal and their receipts resolve in the same transaction. */
export function deliverSteers(
  pool: pg.Pool,
  childSessionId: string,
  principalAccountId: string,
  steerIds: readonly string[],
): Promise<SteerReceipt[]> {
  assertUuid("childSessionId", childSessionId);
  for (const id of steerIds) assertUuid("steerId", id);
  if (steerIds.length === 0) return Promise.resolve([]);
  return tx(pool, async (c) => {
    await c.query("select 1 from sessions where id = $1::uuid for update", [childSessionId]);
    const { rows } = await c.query<Row>(
      `select * from delegated_steers where id = any($1::uuid[]) and child_session_id = $2::uuid
          and principal_account_id = $3::uuid and status = 'pending' order by created_at, id for update`,
      [steerIds, childSessionId, principalAccountId],
    );
    const steers = rows.map(steerFromRow);
    const entries = await appendIn(
      c,
      childSessionId,
      principalAccountId,
      steers.map((s) => ({
        body: { type: "message" as const, message: { role: "user" as const, content: s.text } },
      })),
    );
    const out: SteerReceipt[] = [];
    for (const [i, s] of steers.entries()) {
      const seq = (entries[i] as { seq: number }).seq;
      const upd = await c.query<Row>(
        `update delegated_steers set status = 'delivered', journal_seq = $2, resolved_at = now()
          where id = $1::uuid returning *`,
        [s.id, seq],
      );
      out.push(steerFromRow(upd.rows[0] as Row));
    }
    return out;
  });
}

export async function dropSteers(
  pool: pg.Pool,
  childSessionId: string,
  principalAccountId: string,
  reason: string,
): Promise<SteerReceipt[]> {
  assertUuid("childSessionId", childSessionId);
  const { rows } = await pool.query<Row>(
    `update delegated_steers set status = 'dropped', drop_reason = $3, resolved_at = now()
      where child_session_id = $1::uuid and principal_account_id = $2::uuid and status = 'pending' returning *`,
    [childSessionId, principalAccountId, reason],
  );
  return rows.map(steerFromRow);
}
