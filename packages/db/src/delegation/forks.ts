import type pg from "pg";
import { tx } from "../tx.js";
import { assertUuid, notFound } from "./rows.js";

const BATCH = 200;

/**
 * Copies a fork's context in batches, each its own short transaction on the private target, so the source's
 * writer is never held and a crash leaves only a private, discardable copy. Returns the rows copied.
 */
export async function copyJournalBranch(
  pool: pg.Pool,
  sourceSessionId: string,
  targetSessionId: string,
  principalAccountId: string,
  uptoSeq: number,
): Promise<number> {
  assertUuid("sourceSessionId", sourceSessionId);
  assertUuid("targetSessionId", targetSessionId);
  let copied = 0;
  for (let from = 1; from <= uptoSeq; from += BATCH) {
    const to = Math.min(uptoSeq, from + BATCH - 1);
    copied += await tx(pool, async (c) => {
      const target = await c.query(
        `select 1 from sessions where id = $1::uuid and principal_account_id = $2::uuid and visibility = 'private'
            and fork_of_session_id = $3::uuid for update`,
        [targetSessionId, principalAccountId, sourceSessionId],
      );
      if (!target.rowCount) throw notFound("private fork session", { targetSessionId });
      // Result ids stay with the source: the copy is context, not a second delivery.
      const { rowCount } = await c.query(
        `insert into journal_entries (session_id, seq, kind, role, body, result_id, tool_call_id, settled)
         select $1::uuid, seq, kind, role, body, null, tool_call_id, true from journal_entries
          where session_id = $2::uuid and seq between $3 and $4 and settled and not discarded
         on conflict (session_id, seq) do nothing`,
        [targetSessionId, sourceSessionId, from, to],
      );
      await c.query(`update sessions set next_seq = greatest(next_seq, $2::bigint + 1) where id = $1::uuid`, [
        targetSessionId,
        to,
      ]);
      return rowCount ?? 0;
    });
    // Yield between batches so a long copy never starves the event loop.
    await new Promise((r) => setImmediate(r));
  }
  return copied;
}

export async function commitFork(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<void> {
  assertUuid("sessionId", sessionId);
  const { rowCount } = await pool.query(
    `update sessions set visibility = 'visible'
      where id = $1::uuid and principal_account_id = $2::uuid and fork_of_session_id is not null`,
    [sessionId, principalAccountId],
  );
  if (!rowCount) throw notFound("fork session", { sessionId });
}
