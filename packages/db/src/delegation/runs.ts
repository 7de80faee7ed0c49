import type pg from "pg";
import { DelegationDbError } from "../errors.js";
import type {
  AppendOptions,
  NewContinuation,
  NewDelegation,
  SessionRow,
  SettledResult,
  SubagentRun,
} from "../repositories/delegation.js";
import { type Queryable, tx } from "../tx.js";
import { appendIn } from "./journal.js";
import { assertUuid, notFound, type Row, runFromRow, sessionFromRow } from "./rows.js";
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
  return tx(pool, async (c) => {
    await assertParent(c, input.parentSessionId, input.principalAccountId);
    const existing = await runByToolCall(c, input.parentSessionId, input.toolCallId);
    if (existing) {
      const child = await c.query<Row>("select * from sessions where id = $1::uuid", [
        existing.childSessionId,
      ]);
      if (!child.rows[0]) throw notFound("child session", { runId: existing.id });
      return { run: existing, child: sessionFromRow(child.rows[0]), created: false };
    }
    const child = await c.query<Row>(
      `insert into sessions (kind, parent_session_id, principal_account_id, model, scope, visibility, fork_of_session_id)
       values ('delegated', $1::uuid, $2::uuid, $3, $4, $5, $6::uuid) returning *`,
      [
        input.parentSessionId,
        input.principalAccountId,
        input.model,
        input.scope,
        input.fork ? "private" : "visible",
        input.fork?.fromSessionId ?? null,
      ],
    );
    const childRow = sessionFromRow(child.rows[0] as Row);
    const run = await c.query<Row>(
      `insert into subagent_runs (parent_session_id, principal_account_id, tool_call_id, child_session_id, kind, mode, task)
       values ($1::uuid, $2::uuid, $3, $4::uuid, 'delegate', $5, $6) returning *`,
      [
        input.parentSessionId,
        input.principalAccountId,
        input.toolCallId,
        childRow.id,
        input.mode,
        input.task,
      ],
    );
    if (input.worktree)
      await insertIsolatedWorktree(c, childRow.id, input.principalAccountId, input.worktree);
    return { run: runFromRow(run.rows[0] as Row), child: childRow, created: true };
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

export function startRun(
  pool: pg.Pool,
  runId: string,
  generation: number,
  owner: string,
): Promise<{ started: boolean; appended: boolean; run: SubagentRun | null }> {
  assertUuid("runId", runId);
  return tx(pool, async (c) => {
    const { rows } = await c.query<Row>("select * from subagent_runs where id = $1::uuid for update", [
      runId,
    ]);
    const row = rows[0];
    if (!row) throw notFound("run", { runId });
    const run = runFromRow(row);
    // A settling run resumes as running: its settlement drain runs again and re-enters settling.
    if (
      run.generation !== generation ||
      !["queued", "running", "settling"].includes(run.status) ||
      !run.childSessionId
    ) {
      return { started: false, appended: false, run };
    }
    const appended = run.status === "queued";
    if (appended) {
      await appendIn(c, run.childSessionId, run.principalAccountId, [
        { body: { type: "message", message: { role: "user", content: run.task } } },
      ]);
    }
    const upd = await c.query<Row>(
      `update subagent_runs set status = 'running', started_at = coalesce(started_at, now()), updated_at = now(),
              locked_by = $2, locked_at = now()
        where id = $1::uuid returning *`,
      [runId, owner],
    );
    return { started: true, appended, run: runFromRow(upd.rows[0] as Row) };
  });
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
  return tx(pool, async (c) => {
    const { rows } = await c.query<Row>("select * from subagent_runs where id = $1::uuid for update", [
      result.runId,
    ]);
    const row = rows[0];
    if (!row) throw notFound("run", { runId: result.runId });
    const run = runFromRow(row);
    const prior = await c.query<{ id: string }>("select id from delegation_results where run_id = $1::uuid", [
      run.id,
    ]);
    if (prior.rows[0]) return { settled: false, resultId: prior.rows[0].id };
    if (run.generation !== result.generation || !["queued", "running", "settling"].includes(run.status)) {
      throw new DelegationDbError("stale_generation", "the run moved on before this settlement", {
        runId: run.id,
        generation: result.generation,
        current: run.generation,
        status: run.status,
      });
    }
    await c.query(
      `insert into delegation_results
         (id, parent_session_id, principal_account_id, run_id, child_session_id, tool_call_id, kind, outcome, mode,
          body, byte_size, spill_id)
       values ($1::uuid, $2::uuid, $3::uuid, $4::uuid, $5::uuid, $6, 'subagent', $7, $8, $9, $10, $11::uuid)`,
      [
        result.resultId,
        run.parentSessionId,
        run.principalAccountId,
        run.id,
        run.childSessionId,
        run.toolCallId,
        result.outcome,
        run.mode,
        result.body,
        result.byteSize,
        result.spillId ?? null,
      ],
    );
    options.probe?.("settle.before_commit");
    await c.query(
      `update subagent_runs set status = $2, settled_at = now(), updated_at = now(), error = $3::jsonb,
              locked_by = null, locked_at = null
        where id = $1::uuid`,
      [
        run.id,
        result.outcome === "ok" ? "succeeded" : "failed",
        result.error ? JSON.stringify(result.error) : null,
      ],
    );
    return { settled: true, resultId: result.resultId };
  });
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
