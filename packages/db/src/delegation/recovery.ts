import type pg from "pg";
import { DelegationDbError } from "../errors.js";
import type { SpillRecord, SubagentRun } from "../repositories/delegation.js";
import { tx } from "../tx.js";
import { assertUuid, type Row, runFromRow } from "./rows.js";
import { OPEN } from "./runs.js";

/**
 * Recovery ownership: a live process holds a session-level advisory lock named by its owner id for as long
 * as its connection lives. A run whose `locked_by` names an owner nobody holds any more was left by a dead
 * process (SIGKILL runs no hooks, but PostgreSQL drops a dead backend's locks) and may be claimed.
 */
export const OWNER_LOCK_CLASS = 7305;

/** The advisory lock key (pg_locks.objid) of an owner id held as `pg_advisory_lock(class, hashtext(id))`. */
export const lockKey = (ownerSql: string) => `(hashtext(${ownerSql})::bigint & 4294967295)::oid`;

/**
 * Announced (payload: the owner id) when a live process lets go of its owner lease, so that peers sweep for
 * its work at once instead of at their next periodic check. A SIGKILLed process sends nothing: the sweep
 * finds its work.
 */
export const OWNER_RELEASED_CHANNEL = "crw_owner_released";

/**
 * Holds the owner lease on a connection of its own. `onLost` hears when that connection fails while held
 * (the server restarted, the connection was cut): from then on peers see the owner dead and may claim its
 * work, so the holder must stop driving it.
 */
export async function holdOwnerLease(
  pool: pg.Pool,
  owner: string,
  onLost?: (e: unknown) => void,
): Promise<() => Promise<void>> {
  const client = await pool.connect();
  try {
    await client.query("select pg_advisory_lock($1, hashtext($2))", [OWNER_LOCK_CLASS, owner]);
  } catch (e) {
    client.release(true);
    throw e;
  }
  let held = true;
  const lost = (e: unknown) => {
    if (held) onLost?.(e);
    held = false;
  };
  client.on("error", lost);
  return async () => {
    held = false;
    try {
      await client.query("select pg_advisory_unlock($1, hashtext($2))", [OWNER_LOCK_CLASS, owner]);
      // After the unlock: a peer woken by this finds the owner dead.
      await client.query("select pg_notify($1, $2)", [OWNER_RELEASED_CHANNEL, owner]);
    } finally {
      // back in the pool, the connection must not carry this lease's listener to its next user
      client.off("error", lost);
      client.release();
    }
  };
}

/**
 * Takes the recovery lease of open runs no live process owns. At boot (the default) that includes runs with
 * no lease and this owner's own; a live takeover (`deadOwnersOnly`) takes only runs whose named owner holds
 * no lock: a run not yet leased belongs to the live process that is about to start it, and this process's
 * own runs are driven here already.
 */
export function claimOpenRuns(
  pool: pg.Pool,
  owner: string,
  limit: number,
  options: { deadOwnersOnly?: boolean } = {},
): Promise<SubagentRun[]> {
  return tx(pool, async (c) => {
    const { rows } = await c.query<Row>(
      `with orphaned as (
         select r.id from subagent_runs r
          where r.status in ('queued', 'running', 'settling')
            and ((not $4::boolean and (r.locked_by is null or r.locked_by = $1))
                 or (r.locked_by is not null and r.locked_by <> $1 and not exists (
                  select 1 from pg_locks l
                   where l.locktype = 'advisory' and l.granted and l.classid = $3::oid
                     and l.objid = ${lockKey("r.locked_by")} and l.objsubid = 2)))
          order by r.created_at
          for update of r skip locked
          limit $2)
       update subagent_runs r set locked_by = $1, locked_at = now(), updated_at = now()
         from orphaned where r.id = orphaned.id
       returning r.*`,
      [owner, limit, OWNER_LOCK_CLASS, options.deadOwnersOnly === true],
    );
    return rows.map(runFromRow).sort((a, b) => a.createdAt.getTime() - b.createdAt.getTime());
  });
}

/**
 * The takeover sweep's one cheap check: whether any open run, or any workflow still owed its driving or its
 * summary, is leased by an owner that holds no lock (the live owners are read from pg_locks once). Only then
 * is a recovery pass worth running. Unleased rows are not counted: a live process is about to lease them.
 */
export async function orphanedWork(pool: pg.Pool): Promise<{ runs: boolean; workflows: boolean }> {
  const { rows } = await pool.query<{ runs: boolean; workflows: boolean }>(
    `with live as materialized (
       select l.objid from pg_locks l
        where l.locktype = 'advisory' and l.granted and l.classid = $1::oid and l.objsubid = 2)
     select exists (
              select 1 from subagent_runs r
               where r.status in ('queued', 'running', 'settling') and r.locked_by is not null
                 and not exists (select 1 from live where live.objid = ${lockKey("r.locked_by")})
            ) as runs,
            -- claimInterrupted's predicate as two probes, each on a small set: running workflows (a partial
            -- index) and those still holding a journal (kept only until terminal publication settled).
            exists (
              select 1 from workflows w
               where w.status = 'running' and w.locked_by is not null
                 and not exists (select 1 from live where live.objid = ${lockKey("w.locked_by")})
            ) or exists (
              select 1 from workflow_journals j join workflows w on w.id = j.workflow_id
               where w.summary_result_id is null and w.locked_by is not null
                 and not exists (select 1 from live where live.objid = ${lockKey("w.locked_by")})
            ) as workflows`,
    [OWNER_LOCK_CLASS],
  );
  const r = rows[0];
  return { runs: r?.runs === true, workflows: r?.workflows === true };
}

export async function releaseRun(pool: pg.Pool, runId: string, owner: string): Promise<void> {
  assertUuid("runId", runId);
  await pool.query(
    "update subagent_runs set locked_by = null, locked_at = null where id = $1::uuid and locked_by = $2",
    [runId, owner],
  );
}

/**
 * A live takeover that could not recover a run it claimed hands it back: the lease names an owner nobody
 * holds, so the next sweep (of any process) tries again instead of the run waiting for this one's restart.
 */
export async function handBackRun(pool: pg.Pool, runId: string, owner: string): Promise<void> {
  assertUuid("runId", runId);
  await pool.query(
    `update subagent_runs set locked_by = $2 || ':handed-back', locked_at = now()
      where id = $1::uuid and locked_by = $2 and status in ('queued', 'running', 'settling')`,
    [runId, owner],
  );
}

/**
 * Continuations' new generations, which fence the old lifetimes' writes, in one statement (one commit for a
 * whole batch of a boot's continuations). Charged (one recovery attempt) when it is actually dispatched
 * after a tool call of unknown outcome; free (counted apart) when it repeats no effect. The runs no longer
 * open in that generation are left out of the map.
 */
export async function nextGenerations(
  pool: pg.Pool,
  runs: readonly { runId: string; generation: number; charged: boolean }[],
): Promise<Map<string, { generation: number; recoveryAttempts: number; freeContinuations: number }>> {
  for (const r of runs) assertUuid("runId", r.runId);
  const out = new Map<string, { generation: number; recoveryAttempts: number; freeContinuations: number }>();
  if (runs.length === 0) return out;
  const { rows } = await pool.query<Row>(
    `update subagent_runs r
        set recovery_attempts = r.recovery_attempts + c.charged,
            free_continuations = r.free_continuations + 1 - c.charged,
            generation = r.generation + 1, updated_at = now(),
            -- the new generation's job numbers its progress from 1 again
            progress_seq = 0
       from unnest($1::uuid[], $2::bigint[], $3::int[]) as c(id, generation, charged)
      where r.id = c.id and r.generation = c.generation and r.status in ('queued', 'running', 'settling')
      returning r.id, r.generation, r.recovery_attempts, r.free_continuations`,
    [runs.map((r) => r.runId), runs.map((r) => r.generation), runs.map((r) => (r.charged ? 1 : 0))],
  );
  for (const r of rows) {
    out.set(String(r.id), {
      generation: Number(r.generation),
      recoveryAttempts: Number(r.recovery_attempts),
      freeContinuations: Number(r.free_continuations),
    });
  }
  return out;
}

/**
 * Whether another process holds an owner lease on this database now (any owner but `own`): a booting
 * process then recovers only dead owners' work, as a live takeover does, and leaves every other journal,
 * fork copy and not-yet-leased run to the live ones.
 */
export async function otherOwnersLive(pool: pg.Pool, own: readonly string[]): Promise<boolean> {
  const { rows } = await pool.query<{ live: boolean }>(
    `select exists (
       select 1 from pg_locks l
        where l.locktype = 'advisory' and l.granted and l.classid = $1::oid and l.objsubid = 2
          and l.database = (select oid from pg_database where datname = current_database())
          and l.objid not in (select ${lockKey("o")} from unnest($2::text[]) as o)
     ) as live`,
    [OWNER_LOCK_CLASS, own],
  );
  return rows[0]?.live === true;
}

/**
 * Boot, before recovery claims: unfinished private fork copies go, with everything under them. Given
 * `among` (a live takeover: the children of the runs it claimed from dead owners), only those of them that
 * are private go; another process's copy in progress is left alone.
 */
export async function discardPrivateSessions(pool: pg.Pool, among?: readonly string[]): Promise<string[]> {
  for (const id of among ?? []) assertUuid("sessionId", id);
  if (among?.length === 0) return [];
  return tx(pool, async (c) => {
    const { rows } = await c.query<{ id: string }>(
      `with recursive doomed(id) as (
         select id from sessions where visibility = 'private' and ($1::uuid[] is null or id = any($1::uuid[]))
         union select s.id from sessions s join doomed d on s.parent_session_id = d.id)
       select id from doomed`,
      [among ?? null],
    );
    const ids = rows.map((r) => r.id);
    if (ids.length === 0) return [];
    await c.query("delete from delegated_steers where child_session_id = any($1::uuid[])", [ids]);
    await c.query("delete from delegation_result_acks where parent_session_id = any($1::uuid[])", [ids]);
    await c.query(
      "delete from delegation_results where parent_session_id = any($1::uuid[]) or child_session_id = any($1::uuid[])",
      [ids],
    );
    await c.query("delete from spilled_outputs where session_id = any($1::uuid[])", [ids]);
    await c.query("delete from subagent_runs where parent_session_id = any($1::uuid[])", [ids]);
    await c.query("delete from journal_entries where session_id = any($1::uuid[])", [ids]);
    // Children first (they reference their parents); a parent's run keeps its row with a null child.
    for (let left = ids.length; left > 0; ) {
      const { rowCount } = await c.query(
        `delete from sessions where id = any($1::uuid[])
            and not exists (select 1 from sessions k where k.parent_session_id = sessions.id)`,
        [ids],
      );
      if (!rowCount) break;
      left -= rowCount;
    }
    return ids;
  });
}

/** Every session with a dangling tool call, or (a live takeover) only those among `sessionIds`. */
export async function sessionsWithDanglingToolCalls(
  pool: pg.Pool,
  sessionIds?: readonly string[],
): Promise<Array<{ sessionId: string; principalAccountId: string }>> {
  for (const id of sessionIds ?? []) assertUuid("sessionId", id);
  const { rows } = await pool.query<{ session_id: string; principal_account_id: string }>(
    `select distinct i.session_id, s.principal_account_id from journal_entries i
       join sessions s on s.id = i.session_id
      where i.kind = 'tool_intent' and not i.discarded and s.visibility = 'visible'
        and ($1::uuid[] is null or i.session_id = any($1::uuid[]))
        and not exists (select 1 from journal_entries r
                         where r.session_id = i.session_id and r.tool_call_id = i.tool_call_id
                           and r.role = 'toolResult' and not r.discarded)`,
    [sessionIds ?? null],
  );
  return rows.map((r) => ({ sessionId: r.session_id, principalAccountId: r.principal_account_id }));
}

export async function recordSpill(
  pool: pg.Pool,
  record: Omit<SpillRecord, "id"> & { principalAccountId: string },
): Promise<SpillRecord> {
  assertUuid("sessionId", record.sessionId);
  const { rows } = await pool.query<Row>(
    `insert into spilled_outputs (session_id, principal_account_id, path, byte_size, sha256)
     values ($1::uuid, $2::uuid, $3, $4, $5)
     on conflict (path) do update set byte_size = excluded.byte_size, sha256 = excluded.sha256
       where spilled_outputs.session_id = excluded.session_id
     returning id`,
    [record.sessionId, record.principalAccountId, record.path, record.byteSize, record.sha256],
  );
  const row = rows[0];
  // the path is another session's spill: it stays that session's
  if (!row)
    throw new DelegationDbError("conflict", `spill path ${record.path} belongs to another session`, {
      sessionId: record.sessionId,
      path: record.path,
    });
  return {
    id: String(row.id),
    sessionId: record.sessionId,
    path: record.path,
    byteSize: record.byteSize,
    sha256: record.sha256,
  };
}

export async function sessionsWithQueuedResults(
  pool: pg.Pool,
): Promise<Array<{ sessionId: string; principalAccountId: string; kind: "root" | "delegated" }>> {
  const { rows } = await pool.query<{ id: string; principal_account_id: string; kind: string }>(
    `select distinct s.id, s.principal_account_id, s.kind from delegation_results r
       join sessions s on s.id = r.parent_session_id
      where s.visibility = 'visible'
        and not r.acknowledged and not exists (select 1 from delegation_result_acks a where a.result_id = r.id)`,
  );
  return rows.map((r) => ({
    sessionId: r.id,
    principalAccountId: r.principal_account_id,
    kind: r.kind === "root" ? "root" : "delegated",
  }));
}

export async function spilledOutput(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  path: string,
): Promise<SpillRecord | null> {
  assertUuid("sessionId", sessionId);
  assertUuid("principalAccountId", principalAccountId);
  const { rows } = await pool.query<Row>(
    `select id, session_id, path, byte_size, sha256 from spilled_outputs
      where session_id = $1::uuid and principal_account_id = $2::uuid and path = $3`,
    [sessionId, principalAccountId, path],
  );
  const r = rows[0];
  if (!r) return null;
  return {
    id: String(r.id),
    sessionId: String(r.session_id),
    path: String(r.path),
    byteSize: Number(r.byte_size),
    sha256: String(r.sha256),
  };
}

export async function hasSpillsOrOpenChildren(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<boolean> {
  assertUuid("sessionId", sessionId);
  assertUuid("principalAccountId", principalAccountId);
  const { rows } = await pool.query<{ yes: boolean }>(
    `select exists (select 1 from spilled_outputs where session_id = $1::uuid and principal_account_id = $2::uuid)
         or exists (select 1 from subagent_runs where parent_session_id = $1::uuid
                      and principal_account_id = $2::uuid and status in ${OPEN}) as yes`,
    [sessionId, principalAccountId],
  );
  return rows[0]?.yes === true;
}
