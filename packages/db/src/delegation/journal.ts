import type pg from "pg";
import { DelegationDbError } from "../errors.js";
import { JOURNAL_WAKE_CHANNEL, wakeWanted } from "../listen.js";
import type { AppendOptions, JournalDelta, SettlementWork } from "../repositories/delegation.js";
import {
  type JournalBody,
  type JournalEntry,
  type JournalWrite,
  journalBodySchema,
  type ProviderUsage,
  providerUsageSchema,
  resultIdOf,
  type TranscriptMessage,
} from "../repositories/journal.js";
import { type Queryable, tx } from "../tx.js";
import { assertUuid, decodeBody, entryDecodedBy, entryFromRow, notFound, type Row } from "./rows.js";
import { workFromRow, workOf } from "./runs.js";

interface RowShape {
  kind: "message" | "custom_message" | "compaction" | "tool_intent";
  role: string | null;
  body: string;
  resultId: string | null;
  toolCallId: string | null;
  settled: boolean;
  usage: string | null;
}

/**
 * The rows an append's statement answers. A body that is one of the texts this append wrote is the JSON of a
 * body the schema accepted (`shape`), so JSON.parse alone reads it back: decoding it with the schema again
 * checked every row a turn writes twice. Any other text is decoded as a read would.
 */
function writtenEntries(returned: readonly Row[], written: readonly RowShape[]): JournalEntry[] {
  const texts = new Set(written.map((w) => w.body));
  const decode = (sessionId: string, seq: number, text: string): JournalBody =>
    texts.has(text) ? (JSON.parse(text) as JournalBody) : decodeBody(sessionId, seq, text);
  return returned.map((r) => entryDecodedBy(r, decode));
}

export function shape(sessionId: string, write: JournalWrite): RowShape {
  const parsed = journalBodySchema.safeParse(write.body);
  if (!parsed.success) {
    throw new DelegationDbError(
      "malformed_entry",
      `refused a malformed journal entry: ${parsed.error.message}`,
      {
        sessionId,
      },
    );
  }
  const body: JournalBody = parsed.data;
  let usage: string | null = null;
  if (write.usage !== undefined) {
    const u = providerUsageSchema.safeParse(write.usage);
    if (!u.success || body.type !== "message" || body.message.role !== "assistant") {
      throw new DelegationDbError(
        "malformed_entry",
        u.success
          ? "refused provider usage on a row that is not an assistant message"
          : `refused malformed provider usage: ${u.error.message}`,
        { sessionId },
      );
    }
    usage = JSON.stringify(u.data);
  }
  const base = {
    body: JSON.stringify(body),
    resultId: resultIdOf(body) ?? null,
    settled: write.settled ?? true,
    usage,
  };
  switch (body.type) {
    case "compaction":
      return { ...base, kind: "compaction", role: null, toolCallId: null };
    case "tool_intent":
      return { ...base, kind: "tool_intent", role: null, toolCallId: body.toolCallId };
    case "message": {
      const m = body.message;
      if (m.role === "custom") return { ...base, kind: "custom_message", role: null, toolCallId: null };
      return {
        ...base,
        kind: "message",
        role: m.role,
        toolCallId: m.role === "toolResult" ? m.toolCallId : null,
      };
    }
  }
}

/**
 * Appends rows in one statement: taking the sequence numbers (an update of the session row, which holds
 * the row lock to the end of the statement or of the caller's transaction) and inserting the rows are one
 * atomic step, so a journal has one writer at a time and its seqs have no gaps or duplicates. The insert
 * numbers its rows from the update's result, which sees the newest committed next_seq even after waiting
 * on a concurrent appender's lock.
 */
export async function appendIn(
  client: Queryable,
  sessionId: string,
  principalAccountId: string,
  writes: readonly JournalWrite[],
): Promise<JournalEntry[]> {
  return (await appendRows(client, sessionId, principalAccountId, writes)).entries;
}

/**
 * appendIn; with `systemPrompt`, the session's system prompt is stored by the same statement unless one is
 * stored already (first writer wins), and `systemPrompt` answers the one stored after it.
 */
async function appendRows(
  client: Queryable,
  sessionId: string,
  principalAccountId: string,
  writes: readonly JournalWrite[],
  systemPrompt?: string,
): Promise<{ entries: JournalEntry[]; systemPrompt: string | null }> {
  assertUuid("sessionId", sessionId);
  const rows = writes.map((w) => shape(sessionId, w));
  if (rows.length === 0) return { entries: [], systemPrompt: null };
  // The wake notification, when some process watches this journal, rides on the statement that takes the
  // seqs (no statement of its own): queued now, sent at commit, dropped with a rollback.
  const woke = wakeWanted("journal", sessionId)
    ? `pg_notify('${JOURNAL_WAKE_CHANNEL}', id::text || ':' || (next_seq - 1)::text)`
    : "null";
  const prompt = systemPrompt !== undefined;
  const insert = `insert into journal_entries (session_id, seq, kind, role, body, result_id, tool_call_id,
                                    settled, provider_usage)
       select $1::uuid, taken.first + t.n - 1, t.kind, t.role, t.body, t.result_id, t.tool_call_id, t.settled,
              t.usage::jsonb
         from taken,
              unnest($2::text[], $3::text[], $4::text[], $5::uuid[], $6::text[], $7::boolean[], $8::text[])
                with ordinality as t(kind, role, body, result_id, tool_call_id, settled, usage, n)
       returning session_id, seq, body, settled, created_at`;
  try {
    const inserted = await client.query<Row>(
      `with taken as (
         update sessions set next_seq = next_seq + $10
                ${prompt ? ", system_prompt = coalesce(system_prompt, $11::text)" : ""}
          where id = $1::uuid and principal_account_id = $9::uuid
          returning next_seq - $10 as first, ${woke} as woke${prompt ? ", system_prompt" : ""}
       )
       ${prompt ? `, added as (${insert}) select added.*, taken.system_prompt from added, taken` : insert}`,
      [
        sessionId,
        rows.map((r) => r.kind),
        rows.map((r) => r.role),
        rows.map((r) => r.body),
        rows.map((r) => r.resultId),
        rows.map((r) => r.toolCallId),
        rows.map((r) => r.settled),
        rows.map((r) => r.usage),
        principalAccountId,
        rows.length,
        ...(prompt ? [systemPrompt] : []),
      ],
    );
    if (inserted.rows.length === 0) throw notFound("session", { sessionId });
    const stored = inserted.rows[0]?.system_prompt;
    return {
      entries: writtenEntries(inserted.rows, rows).sort((a, b) => a.seq - b.seq),
      systemPrompt: typeof stored === "string" ? stored : null,
    };
  } catch (e) {
    if ((e as { code?: string }).code === "23505") {
      throw new DelegationDbError(
        "conflict",
        "this result is already in the session's journal",
        { sessionId },
        {
          cause: e,
        },
      );
    }
    throw e;
  }
}

/** `appendIn` on its own: the one statement commits by itself, no transaction around it. */
export function append(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  writes: readonly JournalWrite[],
  _options?: AppendOptions,
): Promise<JournalEntry[]> {
  return appendIn(pool, sessionId, principalAccountId, writes);
}

/** `append` that also stores the session's system prompt unless one is stored (see the repository). */
export function appendWithSystemPrompt(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  writes: readonly JournalWrite[],
  systemPrompt: string,
): Promise<{ entries: JournalEntry[]; systemPrompt: string | null }> {
  return appendRows(pool, sessionId, principalAccountId, writes, systemPrompt);
}

export async function readJournal(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  options: { fromSeq?: number; includeProvisional?: boolean } = {},
): Promise<JournalEntry[]> {
  assertUuid("sessionId", sessionId);
  // One statement is one snapshot: the visibility check and the rows agree without a transaction. The left
  // join keeps one (null) row for a visible session with no matching rows; an invisible one gives none.
  const { rows } = await pool.query<Row>(
    `select j.session_id, j.seq, j.body, j.settled, j.created_at
       from sessions s
       left join journal_entries j
         on j.session_id = s.id and not j.discarded and j.seq >= $2 and (j.settled or $3)
      where s.id = $1::uuid and s.principal_account_id = $4::uuid and s.visibility = 'visible'
      order by j.seq`,
    [sessionId, options.fromSeq ?? 1, options.includeProvisional ?? false, principalAccountId],
  );
  if (rows.length === 0) throw notFound("session", { sessionId });
  return rows.filter((r) => r.seq !== null).map(entryFromRow);
}

/**
 * The settled rows from the newest settled assistant message on (the whole journal when it has none), in
 * one snapshot: enough to tell whether the journal ends with an answer and what its newest turn left open.
 */
export async function readJournalTail(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<JournalEntry[]> {
  return (await tailRows(pool, sessionId, principalAccountId, false)).tail;
}

/**
 * Journals of at most this many rows come whole with their tail in journalTailWithWork: a recovered call's
 * turn then folds them instead of reading them again, and holding them until the call runs stays small.
 */
export const WHOLE_JOURNAL_ROWS = 64;

/** A journal's tail with its session's settlement work (and, for a short journal, all of it). */
export type TailWithWork = {
  tail: JournalEntry[];
  work: SettlementWork;
  whole?: { journal: JournalDelta; nextSeq: number };
};

/**
 * readJournalTail with the session's settlementWork counted in the same statement; a journal of at most
 * WHOLE_JOURNAL_ROWS rows also comes whole, as readJournalAfter(0) reads it, with the seq its next row takes.
 */
export async function journalTailWithWork(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<TailWithWork> {
  const { tail, first, whole } = await tailRows(pool, sessionId, principalAccountId, true);
  return { tail, work: workFromRow(first), ...(whole && { whole }) };
}

async function tailRows(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  withWork: boolean,
): Promise<{ tail: JournalEntry[]; first: Row; whole?: { journal: JournalDelta; nextSeq: number } }> {
  assertUuid("sessionId", sessionId);
  // As readJournal: a visible session with no rows gives one null row from the left join, an invisible one
  // none. A short journal (only asked with the work) comes with every row, provisional ones included, and
  // its tail is taken from them here, by the same rule the join applies to a long one.
  const { rows } = await pool.query<Row>(
    `select ${TAIL_COLUMNS}${withWork ? ", work.*" : ""}
       from sessions s
       ${tailJoins(withWork ? "$3" : "0")}
       ${withWork ? `cross join (select ${workOf("$1::uuid", "$2::uuid")}) work` : ""}
       left join journal_entries j ${TAIL_ROWS}
      where s.id = $1::uuid and s.principal_account_id = $2::uuid and s.visibility = 'visible'
      order by j.seq`,
    withWork ? [sessionId, principalAccountId, WHOLE_JOURNAL_ROWS] : [sessionId, principalAccountId],
  );
  const first = rows[0];
  if (!first) throw notFound("session", { sessionId });
  return { ...tailOf(rows), first };
}

const TAIL_COLUMNS = `j.session_id, j.seq, j.body, j.settled, j.created_at, newest.from_seq, size.short,
            s.next_seq, s.prefix_reclaimed_rows`;

/** The newest settled assistant row's seq, and whether the journal is short (`whole` rows at most). */
const tailJoins = (whole: string) => `cross join lateral (
         select coalesce((select seq from journal_entries
                           where session_id = s.id and role = 'assistant' and not discarded and settled
                           order by seq desc limit 1), 1) as from_seq
       ) newest
       cross join lateral (select s.next_seq - 1 <= ${whole} as short) size`;

/** A short journal's every row, a long one's settled rows from its newest assistant row. */
const TAIL_ROWS = `on j.session_id = s.id and not j.discarded
        and (size.short or (j.settled and j.seq >= newest.from_seq))`;

/** One session's rows of a tail read: its tail, and the whole journal when it is short. */
function tailOf(rows: readonly Row[]): {
  tail: JournalEntry[];
  whole?: { journal: JournalDelta; nextSeq: number };
} {
  const first = rows[0] as Row;
  const entries = rows.filter((r) => r.seq !== null).map(entryFromRow);
  if (!first.short) return { tail: entries };
  const fromSeq = Number(first.from_seq);
  const tail = entries.filter((e) => e.settled && e.seq >= fromSeq);
  const journal = { entries, anchorCreatedAt: null, reclaimedRows: Number(first.prefix_reclaimed_rows) };
  return { tail, whole: { journal, nextSeq: Number(first.next_seq) } };
}

/**
 * journalTailWithWork for many sessions in one statement (boot recovery reads every claimed child so). A
 * session that is not visible is missing from the map.
 */
export async function journalTailsWithWork(
  pool: pg.Pool,
  sessions: readonly { sessionId: string; principalAccountId: string }[],
): Promise<Map<string, TailWithWork>> {
  for (const s of sessions) assertUuid("sessionId", s.sessionId);
  const out = new Map<string, TailWithWork>();
  if (sessions.length === 0) return out;
  const { rows } = await pool.query<Row>(
    `select s.id as tail_of, ${TAIL_COLUMNS}, work.*
       from unnest($1::uuid[], $2::uuid[]) with ordinality as c(id, principal, ord)
       join sessions s on s.id = c.id and s.principal_account_id = c.principal and s.visibility = 'visible'
       ${tailJoins("$3")}
       cross join lateral (select ${workOf("s.id", "s.principal_account_id")}) work
       left join journal_entries j ${TAIL_ROWS}
      order by c.ord, j.seq`,
    [sessions.map((s) => s.sessionId), sessions.map((s) => s.principalAccountId), WHOLE_JOURNAL_ROWS],
  );
  const bySession = new Map<string, Row[]>();
  for (const r of rows) {
    const id = String(r.tail_of);
    const list = bySession.get(id);
    if (list) list.push(r);
    else bySession.set(id, [r]);
  }
  for (const [id, list] of bySession) out.set(id, { ...tailOf(list), work: workFromRow(list[0] as Row) });
  return out;
}

export async function assertVisible(
  c: Queryable,
  sessionId: string,
  principalAccountId: string,
): Promise<void> {
  const { rowCount } = await c.query(
    `select 1 from sessions where id = $1::uuid and principal_account_id = $2::uuid and visibility = 'visible'`,
    [sessionId, principalAccountId],
  );
  if (!rowCount) throw notFound("session", { sessionId });
}

export async function recentAssistantMessages(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  limit: number,
  beforeSeq?: number,
): Promise<AssistantRow[]> {
  assertUuid("sessionId", sessionId);
  // The visibility check rides on the read (one snapshot): a visible session with no such row gives one
  // null row from the left join, an invisible one gives none.
  const { rows: found } = await pool.query<Row>(
    `select j.seq, j.body, j.provider_usage
       from sessions s
       left join lateral (
         select seq, body, provider_usage from journal_entries
          where session_id = s.id and role = 'assistant' and not discarded and settled and seq < $2
          order by seq desc limit $3
       ) j on true
      where s.id = $1::uuid and s.principal_account_id = $4::uuid and s.visibility = 'visible'
      order by j.seq desc`,
    [sessionId, beforeSeq ?? Number.MAX_SAFE_INTEGER, limit, principalAccountId],
  );
  return assistantRowsOf(sessionId, found);
}

/**
 * A call's run marked settling (fenced by its generation, as markRunSettling) and its child's newest
 * assistant message read, in one statement: the settlement's reply comes from the turn that just ended.
 * The read is the statement's snapshot, which the mark does not change.
 */
export async function markSettlingWithReply(
  pool: pg.Pool,
  runId: string,
  generation: number,
  childSessionId: string,
  principalAccountId: string,
  options: { whenIdle?: boolean } = {},
): Promise<{ marked: boolean; reply: AssistantRow | null; work?: SettlementWork }> {
  assertUuid("runId", runId);
  assertUuid("childSessionId", childSessionId);
  // With whenIdle the child's inbox is counted in the same snapshot, and the mark waits for an idle inbox:
  // no open call of the child, no pending steer, no unacknowledged result.
  const idle = options.whenIdle === true;
  const { rows: found } = await pool.query<Row>(
    `with ${idle ? `work as (select ${workOf("$3::uuid", "$4::uuid")}),` : ""}
     mark as (
       update subagent_runs set status = 'settling', updated_at = now()
        where id = $1::uuid and generation = $2 and status in ('running', 'settling')
          ${idle ? "and (select runs + steers + queued from work) = 0" : ""}
        returning 1
     )
     select j.seq, j.body, j.provider_usage, (select count(*) from mark)::int as marked${idle ? ", work.*" : ""}
       from sessions s
       ${idle ? "cross join work" : ""}
       left join lateral (
         select seq, body, provider_usage from journal_entries
          where session_id = s.id and role = 'assistant' and not discarded and settled
          order by seq desc limit 1
       ) j on true
      where s.id = $3::uuid and s.principal_account_id = $4::uuid and s.visibility = 'visible'`,
    [runId, generation, childSessionId, principalAccountId],
  );
  const [reply] = assistantRowsOf(childSessionId, found);
  const marked = Number(found[0]?.marked) > 0;
  return idle
    ? { marked, reply: reply ?? null, work: workFromRow(found[0] ?? {}) }
    : { marked, reply: reply ?? null };
}

type AssistantRow = { seq: number; message: TranscriptMessage; usage?: ProviderUsage };

/** Assistant rows as a visibility-checked read returns them: none at all is a session not found. */
function assistantRowsOf(sessionId: string, found: Row[]): AssistantRow[] {
  if (found.length === 0) throw notFound("session", { sessionId });
  const rows = found.filter((r) => r.seq !== null);
  return rows.map((r) => {
    const seq = Number(r.seq);
    const body = decodeBody(sessionId, seq, String(r.body));
    if (body.type !== "message")
      throw new DelegationDbError("malformed_entry", "assistant row is not a message", { sessionId, seq });
    if (r.provider_usage === null || r.provider_usage === undefined) return { seq, message: body.message };
    const usage = providerUsageSchema.safeParse(r.provider_usage);
    if (!usage.success)
      throw new DelegationDbError("malformed_entry", `malformed provider usage: ${usage.error.message}`, {
        sessionId,
        seq,
      });
    return { seq, message: body.message, usage: usage.data };
  });
}

export async function settleProvisional(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  as: "settled" | "discarded",
): Promise<number> {
  assertUuid("sessionId", sessionId);
  // Settled rows become visible to live views: wake them (in the same statement, only when a row changed).
  const woke = wakeWanted("journal", sessionId)
    ? `pg_notify('${JOURNAL_WAKE_CHANNEL}', $1::uuid::text)`
    : "null";
  const { rows } = await pool.query<{ n: number }>(
    `with u as (update journal_entries j set settled = true, discarded = $3
                  from sessions s
                 where s.id = j.session_id and s.id = $1::uuid and s.principal_account_id = $2::uuid
                   and not j.settled and not j.discarded
                returning 1),
          woke as (select ${woke} where exists (select 1 from u))
     select (select count(*) from u)::int as n, (select count(*) from woke)::int as woke`,
    [sessionId, principalAccountId, as === "discarded"],
  );
  return rows[0]?.n ?? 0;
}

/**
 * Delivery is proved by the journal alone: every settled, undiscarded row whose original JSON carries
 * details.resultId, including rows a compaction has since summarised. One repeatable-read snapshot, so a
 * delivery committing meanwhile is either wholly in the answer or wholly out of it.
 */
export async function settledResultIds(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<string[]> {
  assertUuid("sessionId", sessionId);
  return tx(
    pool,
    async (c) => {
      await assertVisible(c, sessionId, principalAccountId);
      const { rows } = await c.query<Row>(
        `select seq, body, result_id from journal_entries
          where session_id = $1::uuid and settled and not discarded and kind in ('custom_message', 'message')
          order by seq`,
        [sessionId],
      );
      const ids: string[] = [];
      for (const r of rows) {
        const id = resultIdOf(decodeBody(sessionId, Number(r.seq), String(r.body)));
        // A row delivered here stores its result id beside the JSON. A fork's copied context keeps the
        // parent's details.resultId in its JSON but not in the column: inherited context, not a delivery.
        if (id && typeof r.result_id === "string" && r.result_id.toLowerCase() === id.toLowerCase())
          ids.push(id);
      }
      return ids;
    },
    { isolation: "repeatable read", readOnly: true },
  );
}

/**
 * getLatestTurn: the rows of a session's newest turn, provisional rows and custom events (delivered results,
 * steers, interruption notices) included, discarded rows never. A turn ends with a settled assistant answer
 * (any stop reason but toolUse, and no tool call in it). When rows follow the newest answer, the newest turn is the open (or
 * interrupted) one made of those rows; otherwise it is the finished turn that answer ended, back to the
 * answer before it. Two index probes and the turn's own rows: never the whole journal.
 */
export async function latestTurn(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<JournalEntry[]> {
  assertUuid("sessionId", sessionId);
  return tx(
    pool,
    async (c) => {
      await assertVisible(c, sessionId, principalAccountId);
      const answerBefore = async (seq: number | null): Promise<number> => {
        const { rows } = await c.query<{ seq: string }>(
          `select seq from journal_entries
            where session_id = $1::uuid and role = 'assistant' and not discarded and settled
              and ($2::bigint is null or seq < $2::bigint)
              and (body::jsonb -> 'message' ->> 'stopReason') <> 'toolUse'
              and not (body::jsonb -> 'message' -> 'content') @> '[{"type": "toolCall"}]'::jsonb
            order by seq desc limit 1`,
          [sessionId, seq],
        );
        return rows[0] ? Number(rows[0].seq) : 0;
      };
      const last = await answerBefore(null);
      const after = await c.query(
        "select 1 from journal_entries where session_id = $1::uuid and seq > $2 and not discarded limit 1",
        [sessionId, last],
      );
      const [from, to] =
        (after.rowCount ?? 0) > 0 || last === 0
          ? [last + 1, Number.MAX_SAFE_INTEGER]
          : [(await answerBefore(last)) + 1, last];
      const { rows } = await c.query<Row>(
        `select session_id, seq, body, settled, created_at from journal_entries
          where session_id = $1::uuid and not discarded and seq between $2 and $3
          order by seq`,
        [sessionId, from, to],
      );
      return rows.map(entryFromRow);
    },
    { isolation: "repeatable read", readOnly: true },
  );
}

/**
 * A journal's rows after `afterSeq` (all of them from 0), in one statement and so one snapshot. A row that
 * commits has every lower seq committed before it (seqs are taken under the session row's lock, held to the
 * commit), so a reader that saw up to some seq misses nothing below it; what can still change below it is a
 * provisional row settling or going, and a dream child's inherited prefix being reclaimed. The row at
 * `afterSeq` and the reclaimed count let the reader tell that the rows it holds are the ones still here.
 */
export async function readJournalAfter(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  afterSeq: number,
): Promise<JournalDelta> {
  assertUuid("sessionId", sessionId);
  const { rows } = await pool.query<Row>(
    `select s.prefix_reclaimed_rows, j.session_id, j.seq, j.body, j.settled, j.created_at
       from sessions s
       left join journal_entries j on j.session_id = s.id and not j.discarded and j.seq >= $2
      where s.id = $1::uuid and s.principal_account_id = $3::uuid and s.visibility = 'visible'
      order by j.seq`,
    [sessionId, afterSeq, principalAccountId],
  );
  const first = rows[0];
  if (!first) throw notFound("session", { sessionId });
  let anchorCreatedAt: Date | null = null;
  const entries: JournalEntry[] = [];
  for (const r of rows) {
    if (r.seq === null) continue;
    if (Number(r.seq) === afterSeq) {
      if (r.settled) anchorCreatedAt = entryFromRow(r).createdAt;
      continue;
    }
    entries.push(entryFromRow(r));
  }
  return { entries, anchorCreatedAt, reclaimedRows: Number(first.prefix_reclaimed_rows) };
}

/**
 * Where a fork of `sessionId` asked by `toolCallId` branches off: the newest settled assistant message
 * holding that tool call (null when none does), and the newest settled seq. The call's own rows (its
 * intent, its result) come after the message that asked, so the backward scan of assistant rows starts
 * below the newest of them: a probe of two indexes, not a read of the journal.
 */
export async function forkPoint(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  toolCallId: string,
): Promise<{ askingSeq: number | null; lastSeq: number }> {
  assertUuid("sessionId", sessionId);
  const { rows } = await pool.query<{ asking: string | null; last: string | null }>(
    `select (select a.seq from journal_entries a
              where a.session_id = s.id and a.role = 'assistant' and not a.discarded and a.settled
                and a.seq < coalesce((select max(c.seq) from journal_entries c
                                       where c.session_id = s.id and c.tool_call_id = $3), 9223372036854775807)
                and (a.body::jsonb -> 'message' -> 'content') @> $4::jsonb
              order by a.seq desc limit 1) as asking,
            (select l.seq from journal_entries l
              where l.session_id = s.id and l.settled and not l.discarded
              order by l.seq desc limit 1) as last
       from sessions s
      where s.id = $1::uuid and s.principal_account_id = $2::uuid and s.visibility = 'visible'`,
    [sessionId, principalAccountId, toolCallId, JSON.stringify([{ type: "toolCall", id: toolCallId }])],
  );
  const row = rows[0];
  if (!row) throw notFound("session", { sessionId });
  return { askingSeq: row.asking === null ? null : Number(row.asking), lastSeq: Number(row.last ?? 0) };
}
