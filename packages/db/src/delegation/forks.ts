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
    `update sessions set visibility = 'visible', inherited_through = next_seq - 1
      where id = $1::uuid and principal_account_id = $2::uuid and fork_of_session_id is not null`,
    [sessionId, principalAccountId],
  );
  if (!rowCount) throw notFound("fork session", { sessionId });
}

/** Why an inherited prefix was not (fully) reclaimed. */
export type PrefixReclaimRefusal =
  | "not_dream"
  | "open_call"
  | "undelivered_result"
  | "no_inherited_prefix"
  | "already_reclaimed";

export interface PrefixReclaim {
  readonly reclaimed: boolean;
  readonly reason?: PrefixReclaimRefusal;
  /** Rows and body bytes deleted by this call (the session row keeps the running totals). */
  readonly rows: number;
  readonly bytes: number;
}

/** At most this many inherited rows are deleted per transaction; each batch re-checks the conditions. */
export const RECLAIM_BATCH = 500;

/**
 * The store side of a dream child's prefix reclamation, which owns its bounds (batches of RECLAIM_BATCH
 * rows, each in its own short transaction under the child's row lock), its marker (prefix_reclaimed_at,
 * set once nothing inherited is left) and its costs (rows and bytes, accumulated on the session row).
 * Every batch re-checks, under that lock: the session is a dream child (its scope carries the host-minted
 * marker), none of its calls is open, and every result of its calls is acknowledged in its parent's
 * journal. Only the inherited rows (seq <= inherited_through) go; the child's own output stays.
 */
export async function reclaimInheritedPrefix(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  options: { batch?: number } = {},
): Promise<PrefixReclaim> {
  assertUuid("sessionId", sessionId);
  assertUuid("principalAccountId", principalAccountId);
  const batch = Math.max(1, Math.min(options.batch ?? RECLAIM_BATCH, RECLAIM_BATCH));
  let rows = 0;
  let bytes = 0;
  for (;;) {
    const step = await tx(pool, async (c): Promise<PrefixReclaim | { more: true }> => {
      const { rows: found } = await c.query<{
        dream: boolean;
        inherited_through: string | null;
        prefix_reclaimed_at: Date | null;
      }>(
        `select coalesce(scope::jsonb ? 'dream', false) as dream, inherited_through, prefix_reclaimed_at
           from sessions where id = $1::uuid and principal_account_id = $2::uuid and kind = 'delegated'
           for update`,
        [sessionId, principalAccountId],
      );
      const session = found[0];
      if (!session) throw notFound("session", { sessionId });
      const refuse = (reason: PrefixReclaimRefusal) => ({ reclaimed: false, reason, rows, bytes });
      if (!session.dream) return refuse("not_dream");
      if (session.prefix_reclaimed_at) return refuse("already_reclaimed");
      const through = session.inherited_through === null ? 0 : Number(session.inherited_through);
      if (through === 0) return refuse("no_inherited_prefix");
      const open = await c.query(
        `select 1 from subagent_runs where child_session_id = $1::uuid and status in ('queued', 'running', 'settling')
          limit 1`,
        [sessionId],
      );
      if (open.rowCount) return refuse("open_call");
      const undelivered = await c.query(
        `select 1 from delegation_results r join subagent_runs sr on sr.id = r.run_id
           left join delegation_result_acks a on a.result_id = r.id
          where sr.child_session_id = $1::uuid and a.result_id is null limit 1`,
        [sessionId],
      );
      if (undelivered.rowCount) return refuse("undelivered_result");
      const deleted = await c.query<{ n: string; b: string }>(
        `with gone as (
           delete from journal_entries where session_id = $1::uuid and seq in (
             select seq from journal_entries where session_id = $1::uuid and seq <= $2 order by seq limit $3)
           returning octet_length(body) as size)
         select count(*)::text as n, coalesce(sum(size), 0)::text as b from gone`,
        [sessionId, through, batch],
      );
      const n = Number(deleted.rows[0]?.n ?? 0);
      const b = Number(deleted.rows[0]?.b ?? 0);
      rows += n;
      bytes += b;
      const left = await c.query(
        "select 1 from journal_entries where session_id = $1::uuid and seq <= $2 limit 1",
        [sessionId, through],
      );
      await c.query(
        `update sessions set prefix_reclaimed_rows = prefix_reclaimed_rows + $2,
                prefix_reclaimed_bytes = prefix_reclaimed_bytes + $3,
                prefix_reclaimed_at = case when $4 then now() else prefix_reclaimed_at end
          where id = $1::uuid`,
        [sessionId, n, b, !left.rowCount],
      );
      if (left.rowCount) return { more: true };
      return { reclaimed: true, rows, bytes };
    });
    if (!("more" in step)) return step;
    await new Promise((r) => setImmediate(r));
  }
}
