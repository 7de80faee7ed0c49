import type pg from "pg";
import { DelegationDbError } from "../errors.js";
import { INBOX_WAKE_CHANNEL, wakeWanted } from "../listen.js";
import type {
  AppendOptions,
  DeliveredResult,
  NewWorkflowSummary,
  QueuedResult,
} from "../repositories/delegation.js";
import type { TranscriptMessage } from "../repositories/journal.js";
import { type Queryable, tx } from "../tx.js";
import { appendIn, assertVisible } from "./journal.js";
import { assertUuid, notFound, type Row, resultFromRow } from "./rows.js";

const RESULT_COLUMNS = `r.id, r.queue_seq, r.parent_session_id, r.child_session_id, r.run_id, r.tool_call_id, r.kind,
  r.outcome, r.mode, r.body, r.byte_size, s.path as spill_path`;

export async function queuedResults(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  limit = 1000,
): Promise<QueuedResult[]> {
  assertUuid("sessionId", sessionId);
  const { rows } = await pool.query<Row>(
    `select ${RESULT_COLUMNS} from delegation_results r left join spilled_outputs s on s.id = r.spill_id
      where r.parent_session_id = $1::uuid and r.principal_account_id = $2::uuid
        and not r.acknowledged and not exists (select 1 from delegation_result_acks a where a.result_id = r.id)
      order by r.queue_seq limit $3`,
    [sessionId, principalAccountId, limit],
  );
  return rows.map(resultFromRow);
}

export async function queuedResultIds(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<string[]> {
  return (await queuedResults(pool, sessionId, principalAccountId)).map((r) => r.id);
}

export async function getResult(
  pool: pg.Pool,
  resultId: string,
  principalAccountId: string,
): Promise<QueuedResult> {
  assertUuid("resultId", resultId);
  const { rows } = await pool.query<Row>(
    `select ${RESULT_COLUMNS} from delegation_results r left join spilled_outputs s on s.id = r.spill_id
      where r.id = $1::uuid and r.principal_account_id = $2::uuid`,
    [resultId, principalAccountId],
  );
  if (!rows[0]) throw notFound("result", { resultId });
  return resultFromRow(rows[0]);
}

export async function resultForRun(
  pool: pg.Pool,
  runId: string,
  principalAccountId: string,
): Promise<QueuedResult | null> {
  assertUuid("runId", runId);
  const { rows } = await pool.query<Row>(
    `select ${RESULT_COLUMNS} from delegation_results r left join spilled_outputs s on s.id = r.spill_id
      where r.run_id = $1::uuid and r.principal_account_id = $2::uuid`,
    [runId, principalAccountId],
  );
  return rows[0] ? resultFromRow(rows[0]) : null;
}

/**
 * Exactly-once delivery. Under the parent session's row lock, the still-unacknowledged results among
 * `resultIds` get their journal rows and their acknowledgements in one transaction: either both are durable
 * or neither is. A concurrent deliverer waits for the lock, then finds them acknowledged and skips them.
 */
export function deliverResults(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  resultIds: readonly string[],
  message: (result: QueuedResult) => TranscriptMessage,
  options: AppendOptions = {},
): Promise<{ delivered: DeliveredResult[]; skipped: string[] }> {
  assertUuid("sessionId", sessionId);
  for (const id of resultIds) assertUuid("resultId", id);
  if (resultIds.length === 0) return Promise.resolve({ delivered: [], skipped: [] });
  return tx(pool, async (c) => {
    await lockVisible(c, sessionId, principalAccountId);
    const { rows } = await c.query<Row>(
      `select ${RESULT_COLUMNS} from delegation_results r left join spilled_outputs s on s.id = r.spill_id
        where r.id = any($3::uuid[]) and r.parent_session_id = $1::uuid and r.principal_account_id = $2::uuid
          and not r.acknowledged and not exists (select 1 from delegation_result_acks a where a.result_id = r.id)
        order by r.queue_seq`,
      [sessionId, principalAccountId, resultIds],
    );
    const pending = rows.map(resultFromRow);
    const pendingIds = new Set(pending.map((r) => r.id));
    const skipped = resultIds.filter((id) => !pendingIds.has(id));
    return {
      delivered: await journalAndAck(c, sessionId, principalAccountId, pending, message, options),
      skipped,
    };
  });
}

/**
 * `deliverResults` for whatever waits: the session's oldest unacknowledged results (up to `limit`), read
 * under its row lock, so a deliverer needs no read of its own first and two deliverers never take the same.
 */
export function deliverQueuedResults(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  message: (result: QueuedResult) => TranscriptMessage,
  options: AppendOptions & { readonly limit?: number } = {},
): Promise<{ delivered: DeliveredResult[]; results: QueuedResult[] }> {
  assertUuid("sessionId", sessionId);
  return tx(pool, async (c) => {
    await lockVisible(c, sessionId, principalAccountId);
    const { rows } = await c.query<Row>(
      `select ${RESULT_COLUMNS} from delegation_results r left join spilled_outputs s on s.id = r.spill_id
        where r.parent_session_id = $1::uuid and r.principal_account_id = $2::uuid
          and not r.acknowledged and not exists (select 1 from delegation_result_acks a where a.result_id = r.id)
        order by r.queue_seq limit $3`,
      [sessionId, principalAccountId, options.limit ?? 1000],
    );
    const results = rows.map(resultFromRow);
    return {
      delivered: await journalAndAck(c, sessionId, principalAccountId, results, message, options),
      results,
    };
  });
}

/**
 * The visibility check and the session's row lock in one statement (checked under the lock, not before).
 * `for no key update` excludes every other deliverer and journal append of the session, but not the key
 * share lock a child's settlement takes on it (its result's foreign key): a settlement never waits for a
 * delivery to commit, and the result it queues meanwhile is the next delivery's.
 */
async function lockVisible(c: Queryable, sessionId: string, principalAccountId: string): Promise<void> {
  const locked = await c.query(
    `select 1 from sessions where id = $1::uuid and principal_account_id = $2::uuid and visibility = 'visible'
        for no key update`,
    [sessionId, principalAccountId],
  );
  if (!locked.rowCount) throw notFound("session", { sessionId });
}

/** Inside the delivery transaction: each pending result's journal row, then its acknowledgement. */
async function journalAndAck(
  c: Queryable,
  sessionId: string,
  principalAccountId: string,
  pending: readonly QueuedResult[],
  message: (result: QueuedResult) => TranscriptMessage,
  options: AppendOptions,
): Promise<DeliveredResult[]> {
  if (pending.length === 0) return [];
  const entries = await appendIn(
    c,
    sessionId,
    principalAccountId,
    pending.map((r) => {
      const m = message(r);
      const carried = m.role === "custom" || m.role === "toolResult" ? m.details?.resultId : undefined;
      if (carried !== r.id) {
        throw new DelegationDbError("invalid_input", "a delivered message must carry its details.resultId", {
          resultId: r.id,
        });
      }
      return { body: { type: "message" as const, message: m } };
    }),
  );
  options.probe?.("delivery.between_append_and_ack");
  // The acknowledgement rows and the results' mirror of them (what the queue's index leaves out), together.
  await c.query(
    `with acked as (
       insert into delegation_result_acks (result_id, parent_session_id, journal_seq)
       select * from unnest($1::uuid[], $2::uuid[], $3::bigint[])
       returning result_id
     )
     update delegation_results set acknowledged = true where id in (select result_id from acked)`,
    [pending.map((r) => r.id), pending.map(() => sessionId), entries.map((e) => e.seq)],
  );
  return pending.map((r, i) => ({
    resultId: r.id,
    journalSeq: (entries[i] as { seq: number }).seq,
    toolCallId: r.toolCallId,
    kind: r.kind,
  }));
}

export function enqueueWorkflowSummary(
  pool: pg.Pool,
  input: NewWorkflowSummary,
): Promise<{ resultId: string; created: boolean }> {
  assertUuid("resultId", input.resultId);
  assertUuid("parentSessionId", input.parentSessionId);
  return tx(pool, async (c) => {
    await assertVisible(c, input.parentSessionId, input.principalAccountId);
    // A client waiting on the parent's inbox (in any process) hears of the summary at its commit.
    const woke = wakeWanted("inbox", input.parentSessionId)
      ? `pg_notify('${INBOX_WAKE_CHANNEL}', $2::uuid::text)`
      : "null";
    const ins = await c.query<{ id: string }>(
      `with ins as (
         insert into delegation_results
           (id, parent_session_id, principal_account_id, tool_call_id, kind, outcome, mode, body, byte_size, spill_id)
         values ($1::uuid, $2::uuid, $3::uuid, $4, 'workflow_summary', $5, 'background', $6, $7, $8::uuid)
         on conflict (parent_session_id, tool_call_id) where kind = 'workflow_summary' do nothing
         returning id
       ), woke as (
         select ${woke} from ins
       )
       select id, (select count(*) from woke)::int as woke from ins`,
      [
        input.resultId,
        input.parentSessionId,
        input.principalAccountId,
        input.toolCallId,
        input.outcome,
        input.body,
        input.byteSize,
        input.spillId ?? null,
      ],
    );
    if (ins.rows[0]) return { resultId: ins.rows[0].id, created: true };
    const prior = await c.query<{ id: string }>(
      `select id from delegation_results where parent_session_id = $1::uuid and tool_call_id = $2
          and kind = 'workflow_summary'`,
      [input.parentSessionId, input.toolCallId],
    );
    return { resultId: (prior.rows[0] as { id: string }).id, created: false };
  });
}
