import type pg from "pg";
import { DelegationDbError } from "../errors.js";
import { INBOX_WAKE_CHANNEL, JOURNAL_WAKE_CHANNEL, wakeWanted } from "../listen.js";
import type {
  AppendOptions,
  JournalDelta,
  NewContinuation,
  NewDelegation,
  SessionRow,
  SettledResult,
  SettlementWork,
  SubagentRun,
} from "../repositories/delegation.js";
import type { JournalEntry, JournalWrite } from "../repositories/journal.js";
import { type Queryable, tx } from "../tx.js";
import { shape } from "./journal.js";
import { assertUuid, entryFromRow, notFound, type Row, runFromRow, sessionFromRow } from "./rows.js";
import { insertIsolatedWorktree } from "./worktrees.js";

export const OPEN = "('queued', 'running', 'settling')";

async function assertParent(
  c: Queryable,
  parentSessionId: string,
  principalAccountId: string,
): Promise<void> {
  const { rows } = await c.query<{ principal_account_id: string }>(
    `select principal_account_id from sessions where id = $1::uuid and visibility = 'visible'`,
    [parentSessionId],
  );
  const row = rows[0];
  if (!row) throw notFound("parent session", { parentSessionId });
  if (row.principal_account_id !== principalAccountId) {
    throw new DelegationDbError("cross_account", "the parent session belongs to another account", {
      parentSessionId,
    });
  }
}

async function runByToolCall(
  c: Queryable,
  parentSessionId: string,
  toolCallId: string,
): Promise<SubagentRun | null> {
  const { rows } = await c.query<Row>(
    `select * from subagent_runs where parent_session_id = $1::uuid and tool_call_id = $2`,
    [parentSessionId, toolCallId],
  );
  return rows[0] ? runFromRow(rows[0]) : null;
}

function checkToolCallId(toolCallId: string): void {
  if (toolCallId.length < 1 || toolCallId.length > 200) {
    throw new DelegationDbError("invalid_input", "tool call id must be 1..200 characters", {});
  }
}

/**
 * The intent of a Delegate call: the child session and its run row, in one transaction, before anything
 * runs. The same (parent, tool call) again returns the existing pair: a retried call never spawns twice.
 */
export function createDelegation(
  pool: pg.Pool,
  input: NewDelegation,
): Promise<{ run: SubagentRun; child: SessionRow; created: boolean }> {
  assertUuid("parentSessionId", input.parentSessionId);
  assertUuid("principalAccountId", input.principalAccountId);
  checkToolCallId(input.toolCallId);
  // The parent check, the retried-call lookup and both inserts are one statement, atomic by itself; only
  // an isolated worktree's row needs a transaction around it.
  const create = async (c: Queryable) => {
    const { rows } = await c.query<Row>(
      `with parent as (
         select principal_account_id from sessions where id = $1::uuid and visibility = 'visible'
       ), existing as (
         select * from subagent_runs where parent_session_id = $1::uuid and tool_call_id = $3
       ), child as (
         insert into sessions (kind, parent_session_id, principal_account_id, model, scope, visibility,
                               fork_of_session_id)
         select 'delegated', $1::uuid, $2::uuid, $4, $5, $6, $7::uuid
           from parent
          where parent.principal_account_id = $2::uuid and not exists (select 1 from existing)
         returning *
       ), run as (
         insert into subagent_runs (parent_session_id, principal_account_id, tool_call_id, child_session_id, kind,
                                    mode, task)
         select $1::uuid, $2::uuid, $3, child.id, 'delegate', $8, $9 from child
         returning *
       )
       select (select principal_account_id from parent) as parent_principal,
              (select to_jsonb(r) from run r) as new_run,
              (select to_jsonb(s) from child s) as new_child,
              (select to_jsonb(e) from existing e) as existing_run,
              (select to_jsonb(s) from sessions s join existing e on s.id = e.child_session_id) as existing_child`,
      [
        input.parentSessionId,
        input.principalAccountId,
        input.toolCallId,
        input.model,
        input.scope,
        input.fork ? "private" : "visible",
        input.fork?.fromSessionId ?? null,
        input.mode,
        input.task,
      ],
    );
    const row = rows[0] as Row;
    if (row.parent_principal === null || row.parent_principal === undefined)
      throw notFound("parent session", { parentSessionId: input.parentSessionId });
    if (row.parent_principal !== input.principalAccountId) {
      throw new DelegationDbError("cross_account", "the parent session belongs to another account", {
        parentSessionId: input.parentSessionId,
      });
    }
    if (row.existing_run) {
      const existing = runFromRow(row.existing_run as Row);
      if (!row.existing_child) throw notFound("child session", { runId: existing.id });
      return { run: existing, child: sessionFromRow(row.existing_child as Row), created: false };
    }
    return {
      run: runFromRow(row.new_run as Row),
      child: sessionFromRow(row.new_child as Row),
      created: true,
    };
  };
  const worktree = input.worktree;
  if (!worktree) return create(pool);
  return tx(pool, async (c) => {
    const out = await create(c);
    if (out.created) await insertIsolatedWorktree(c, out.child.id, input.principalAccountId, worktree);
    return out;
  });
}

/** A DelegateContinue call's row. A child with an open call refuses a second one (`conflict`, child_busy). */
export function createContinuation(
  pool: pg.Pool,
  input: NewContinuation,
): Promise<{ run: SubagentRun; created: boolean }> {
  assertUuid("parentSessionId", input.parentSessionId);
  assertUuid("childSessionId", input.childSessionId);
  assertUuid("principalAccountId", input.principalAccountId);
  checkToolCallId(input.toolCallId);
  return tx(pool, async (c) => {
    await assertParent(c, input.parentSessionId, input.principalAccountId);
    const owned = await c.query(
      `select 1 from sessions where id = $1::uuid and parent_session_id = $2::uuid and principal_account_id = $3::uuid
          and visibility = 'visible'`,
      [input.childSessionId, input.parentSessionId, input.principalAccountId],
    );
    if (!owned.rowCount) throw notFound("child session", { childSessionId: input.childSessionId });
    const existing = await runByToolCall(c, input.parentSessionId, input.toolCallId);
    if (existing) return { run: existing, created: false };
    try {
      await c.query("savepoint open_run");
      const run = await c.query<Row>(
        `insert into subagent_runs
           (parent_session_id, principal_account_id, tool_call_id, child_session_id, kind, mode, task, read_only_scope, model)
         values ($1::uuid, $2::uuid, $3, $4::uuid, 'continue', $5, $6, $7, $8) returning *`,
        [
          input.parentSessionId,
          input.principalAccountId,
          input.toolCallId,
          input.childSessionId,
          input.mode,
          input.task,
          input.readOnlyScope,
          input.model ?? null,
        ],
      );
      if (input.promotedScope !== undefined) {
        await c.query(
          "update sessions set scope = $3 where id = $1::uuid and principal_account_id = $2::uuid",
          [input.childSessionId, input.principalAccountId, input.promotedScope],
        );
      }
      return { run: runFromRow(run.rows[0] as Row), created: true };
    } catch (e) {
      if ((e as { code?: string }).code === "23505") {
        await c.query("rollback to savepoint open_run");
        throw new DelegationDbError("conflict", "the child already has an open call", {
          childSessionId: input.childSessionId,
          reason: "child_busy",
        });
      }
      throw e;
    }
  });
}

export async function getRun(pool: pg.Pool, runId: string, principalAccountId: string): Promise<SubagentRun> {
  assertUuid("runId", runId);
  const { rows } = await pool.query<Row>(
    "select * from subagent_runs where id = $1::uuid and principal_account_id = $2::uuid",
    [runId, principalAccountId],
  );
  if (!rows[0]) throw notFound("run", { runId });
  return runFromRow(rows[0]);
}

export async function runForToolCall(
  pool: pg.Pool,
  parentSessionId: string,
  toolCallId: string,
  principalAccountId: string,
): Promise<SubagentRun | null> {
  assertUuid("parentSessionId", parentSessionId);
  const { rows } = await pool.query<Row>(
    `select * from subagent_runs where parent_session_id = $1::uuid and tool_call_id = $2
        and principal_account_id = $3::uuid`,
    [parentSessionId, toolCallId, principalAccountId],
  );
  return rows[0] ? runFromRow(rows[0]) : null;
}

export async function openRunForChild(
  pool: pg.Pool,
  childSessionId: string,
  principalAccountId: string,
): Promise<SubagentRun | null> {
  assertUuid("childSessionId", childSessionId);
  const { rows } = await pool.query<Row>(
    `select * from subagent_runs where child_session_id = $1::uuid and principal_account_id = $2::uuid
        and status in ${OPEN}`,
    [childSessionId, principalAccountId],
  );
  return rows[0] ? runFromRow(rows[0]) : null;
}

export async function openChildRuns(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<SubagentRun[]> {
  assertUuid("sessionId", sessionId);
  const { rows } = await pool.query<Row>(
    `select * from subagent_runs where parent_session_id = $1::uuid and principal_account_id = $2::uuid
        and status in ${OPEN} order by created_at`,
    [sessionId, principalAccountId],
  );
  return rows.map(runFromRow);
}

/** One snapshot of what a settling session waits for or takes (see DelegationRepository.settlementWork). */
export async function settlementWork(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<SettlementWork> {
  assertUuid("sessionId", sessionId);
  const { rows } = await pool.query<Row>(`select ${workOf("$1::uuid", "$2::uuid")}`, [
    sessionId,
    principalAccountId,
  ]);
  return workFromRow(rows[0] ?? {});
}

/**
 * The columns of settlementWork for `session` (SQL of a session id and its principal): its open child
 * runs, its pending steers, its unacknowledged results and whether it has a spilled output.
 */
export function workOf(session: string, principal: string, prefix = ""): string {
  return `(select count(*) from subagent_runs where parent_session_id = ${session}
             and principal_account_id = ${principal} and status in ${OPEN})::int as ${prefix}runs,
          (select count(*) from delegated_steers where child_session_id = ${session}
             and principal_account_id = ${principal} and status = 'pending')::int as ${prefix}steers,
          (select count(*) from delegation_results r
            where r.parent_session_id = ${session} and r.principal_account_id = ${principal}
              and not r.acknowledged
              and not exists (select 1 from delegation_result_acks a where a.result_id = r.id))::int
            as ${prefix}queued,
          exists (select 1 from spilled_outputs where session_id = ${session}
                    and principal_account_id = ${principal}) as ${prefix}spills`;
}

export function workFromRow(row: Row, prefix = ""): SettlementWork {
  return {
    openChildRuns: Number(row[`${prefix}runs`] ?? 0),
    pendingSteers: Number(row[`${prefix}steers`] ?? 0),
    queuedResults: Number(row[`${prefix}queued`] ?? 0),
    spills: row[`${prefix}spills`] === true,
  };
}

export async function markRunStarted(
  pool: pg.Pool,
  runId: string,
  generation: number,
  owner: string,
): Promise<boolean> {
  const { rowCount } = await pool.query(
    `update subagent_runs set status = 'running', started_at = coalesce(started_at, now()), updated_at = now(),
            locked_by = $3, locked_at = now()
      where id = $1::uuid and generation = $2 and status in ('queued', 'running')`,
    [runId, generation, owner],
  );
  return (rowCount ?? 0) > 0;
}

/** The task's journal row, byte for byte the JSON text `append` stores for a user message of that text. */
const TASK_BODY = `'{"type":"message","message":{"role":"user","content":' || to_json(upd.task)::text || '}}'`;

/**
 * Starts an open run of this generation, in one statement: `prev` locks the run row first and keeps the
 * status it had, which says whether the task still has to be journaled; leaving `queued` journals the task
 * as the child's next row in the same statement, so the start and the task commit together or not at all.
 * A settling run resumes as running: its settlement drain runs again and re-enters settling.
 * `childSessionId`, when the caller knows it, decides whether the child's journal wake is sent.
 */
export async function startRun(
  pool: pg.Pool,
  runId: string,
  generation: number,
  owner: string,
  childSessionId?: string,
  resumeWith?: JournalWrite,
): Promise<{
  started: boolean;
  appended: boolean;
  run: SubagentRun | null;
  child?: SessionRow;
  row?: JournalEntry;
  journal?: JournalDelta;
}> {
  assertUuid("runId", runId);
  // A run that had started goes on with `resumeWith` (shaped here, as any append is), when given.
  const resume = resumeWith && childSessionId ? shape(childSessionId, resumeWith) : null;
  const woke =
    childSessionId === undefined || wakeWanted("journal", childSessionId)
      ? `pg_notify('${JOURNAL_WAKE_CHANNEL}', s.id::text || ':' || (s.next_seq - 1)::text)`
      : "null";
  const { rows } = await pool.query<Row>(
    `with prev as (select id, status from subagent_runs where id = $1::uuid for update),
     upd as (
       update subagent_runs r set status = 'running', started_at = coalesce(r.started_at, now()),
              updated_at = now(), locked_by = $3, locked_at = now()
         from prev
        where r.id = prev.id and r.generation = $2 and r.status in ${OPEN} and r.child_session_id is not null
        returning r.*, prev.status as prev_status
     ),
     taken as (
       update sessions s set next_seq = s.next_seq + 1
         from upd
        where (upd.prev_status = 'queued' or $6::text is not null) and s.id = upd.child_session_id
          and s.principal_account_id = upd.principal_account_id
        returning s.id, s.next_seq - 1 as seq, ${woke} as woke
     ),
     ins as (
       insert into journal_entries (session_id, seq, kind, role, body, settled)
       select taken.id, taken.seq,
              case when upd.prev_status = 'queued' then 'message' else $4::text end,
              case when upd.prev_status = 'queued' then 'user' else $5::text end,
              case when upd.prev_status = 'queued' then ${TASK_BODY} else $6::text end, true
         from taken, upd
       returning session_id, seq, body, settled, created_at
     )
     select upd.*, (select count(*) from ins)::int as appended,
            (select to_jsonb(ins) from ins) as appended_row,
            (select to_jsonb(s) from sessions s
              where s.id = upd.child_session_id and s.principal_account_id = upd.principal_account_id
                and s.visibility = 'visible') as child_row,
            ${workOf("upd.child_session_id", "upd.principal_account_id", "work_")}
       from upd`,
    [runId, generation, owner, resume?.kind ?? null, resume?.role ?? null, resume?.body ?? null],
  );
  const row = rows[0];
  if (!row) {
    const { rows: found } = await pool.query<Row>("select * from subagent_runs where id = $1::uuid", [runId]);
    if (!found[0]) throw notFound("run", { runId });
    return { started: false, appended: false, run: runFromRow(found[0]) };
  }
  const run = runFromRow(row);
  const appended = Number(row.appended) > 0;
  if (row.prev_status === "queued" && !appended) {
    throw notFound("session", { sessionId: run.childSessionId });
  }
  // The child's row as getSession reads it (taken with the start: the caller needs it next).
  const child = row.child_row ? sessionFromRow(row.child_row as Row) : undefined;
  const entry = row.appended_row ? entryFromRow(row.appended_row as Row) : undefined;
  const journal = child && entry ? wholeJournalOf(row.child_row as Row, entry) : undefined;
  return {
    started: true,
    appended,
    run,
    ...(child ? { child, work: workFromRow(row, "work_") } : {}),
    ...(entry ? { row: entry } : {}),
    ...(journal ? { journal } : {}),
  };
}

/**
 * The child's whole journal when the row the start appended is its first and the child holds nothing
 * else (a fresh child: no rows inherited from a parent, none reclaimed from its front): the call's first
 * turn then has nothing more to read.
 */
function wholeJournalOf(child: Row, appended: JournalEntry): JournalDelta | undefined {
  if (appended.seq !== 1) return undefined;
  if (Number(child.prefix_reclaimed_rows ?? 0) !== 0 || (child.inherited_through ?? null) !== null)
    return undefined;
  return { entries: [appended], anchorCreatedAt: null, reclaimedRows: 0 };
}

export async function markRunSettling(pool: pg.Pool, runId: string, generation: number): Promise<boolean> {
  const { rowCount } = await pool.query(
    `update subagent_runs set status = 'settling', updated_at = now()
      where id = $1::uuid and generation = $2 and status in ('running', 'settling')`,
    [runId, generation],
  );
  return (rowCount ?? 0) > 0;
}

/**
 * The run's result enters the parent's inbox and the run becomes terminal, in one transaction. A second
 * settle of the same run (a recovered process racing, a retry) finds the result and changes nothing.
 */
export function settleRun(
  pool: pg.Pool,
  result: SettledResult,
  options: AppendOptions = {},
): Promise<{ settled: boolean; resultId: string }> {
  assertUuid("runId", result.runId);
  assertUuid("resultId", result.resultId);
  // One statement: lock the run, find a prior result, and only for an open run of this generation with none
  // insert the result, make the run terminal, write its last progress snapshot (when given) and (when asked)
  // drop the child's pending steers. Atomic by itself, so the result and the terminal status
  // commit together without a transaction; a probe (a crash test's fault point before the commit) gets one.
  // A client waiting on the parent's inbox (in any process) hears of the result at its commit.
  const woke =
    result.parentSessionId === undefined || wakeWanted("inbox", result.parentSessionId)
      ? `pg_notify('${INBOX_WAKE_CHANNEL}', run.parent_session_id::text)`
      : "null";
  const settle = async (c: Queryable): Promise<{ settled: boolean; resultId: string }> => {
    const { rows } = await c.query<Row>(
      `with run as (
         select * from subagent_runs where id = $1::uuid for update
       ), prior as (
         select id from delegation_results where run_id = $1::uuid
       ), ins as (
         insert into delegation_results
           (id, parent_session_id, principal_account_id, run_id, child_session_id, tool_call_id, kind, outcome,
            mode, body, byte_size, spill_id)
         select $2::uuid, run.parent_session_id, run.principal_account_id, run.id, run.child_session_id,
                run.tool_call_id, 'subagent', $4, run.mode, $5, $6, $7::uuid
           from run
          where run.generation = $3 and run.status in ${OPEN} and not exists (select 1 from prior)
         returning id
       ), upd as (
         update subagent_runs u set status = $8, settled_at = now(), updated_at = now(), error = $9::jsonb,
                locked_by = null, locked_at = null,
                progress = case when $11::int > u.progress_seq then $12 else u.progress end,
                progress_seq = greatest(u.progress_seq, coalesce($11::int, 0))
           from ins
          where u.id = $1::uuid
         returning u.id
       ), dropped as (
         update delegated_steers d set status = 'dropped', drop_reason = $10, resolved_at = now()
           from ins, run
          where $10::text is not null and d.child_session_id = run.child_session_id
            and d.principal_account_id = run.principal_account_id and d.status = 'pending'
         returning d.id
       ), woke as (
         select ${woke} from run, ins
       )
       select run.id, run.generation, run.status, (select id from prior) as prior_id,
              (select id from ins) as inserted_id, (select count(*) from upd)::int as updated,
              (select count(*) from woke)::int as woke
         from run`,
      [
        result.runId,
        result.resultId,
        result.generation,
        result.outcome,
        result.body,
        result.byteSize,
        result.spillId ?? null,
        result.outcome === "ok" ? "succeeded" : "failed",
        result.error ? JSON.stringify(result.error) : null,
        result.dropSteers ?? null,
        result.progress?.seq ?? null,
        result.progress?.snapshot ?? null,
      ],
    );
    const row = rows[0];
    if (!row) throw notFound("run", { runId: result.runId });
    if (typeof row.prior_id === "string") return { settled: false, resultId: row.prior_id };
    if (typeof row.inserted_id === "string") {
      options.probe?.("settle.before_commit");
      return { settled: true, resultId: row.inserted_id };
    }
    // The statement's snapshot predates the lock: a settlement committed while it waited shows only now.
    const prior = await c.query<{ id: string }>("select id from delegation_results where run_id = $1::uuid", [
      result.runId,
    ]);
    if (prior.rows[0]) return { settled: false, resultId: prior.rows[0].id };
    throw new DelegationDbError("stale_generation", "the run moved on before this settlement", {
      runId: result.runId,
      generation: result.generation,
      current: Number(row.generation),
      status: String(row.status),
    });
  };
  return options.probe ? tx(pool, settle) : settle(pool);
}

/**
 * Stores a call's progress snapshot: only the progress columns of an open row of this generation are
 * written (the host-owned scope, status and mode stay as they are); a snapshot older than the stored one is
 * refused, so publication order is the order of `seq`. False when the row is no longer open in this
 * generation or a newer snapshot is stored.
 */
export async function recordRunProgress(
  pool: pg.Pool,
  runId: string,
  principalAccountId: string,
  generation: number,
  seq: number,
  progress: string,
): Promise<boolean> {
  assertUuid("runId", runId);
  assertUuid("principalAccountId", principalAccountId);
  if (!Number.isInteger(seq) || seq < 1) {
    throw new DelegationDbError("invalid_input", "a progress snapshot's seq is a positive integer", {
      runId,
    });
  }
  const { rowCount } = await pool.query(
    `update subagent_runs set progress = $5, progress_seq = $4
      where id = $1::uuid and principal_account_id = $2::uuid and generation = $3
        and status in ('queued', 'running', 'settling') and progress_seq < $4`,
    [runId, principalAccountId, generation, seq, progress],
  );
  return (rowCount ?? 0) > 0;
}

/**
 * Ctrl+B: an open foreground call becomes a background call, durably, before its foreground waiter is let
 * go; its result then goes through the parent's inbox. True when the row is (now) a background call.
 */
export async function moveRunToBackground(
  pool: pg.Pool,
  runId: string,
  principalAccountId: string,
  generation: number,
): Promise<boolean> {
  assertUuid("runId", runId);
  assertUuid("principalAccountId", principalAccountId);
  const { rowCount } = await pool.query(
    `update subagent_runs set mode = 'background', updated_at = now()
      where id = $1::uuid and principal_account_id = $2::uuid and generation = $3
        and status in ('queued', 'running', 'settling')`,
    [runId, principalAccountId, generation],
  );
  return (rowCount ?? 0) > 0;
}
