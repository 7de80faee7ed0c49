import type pg from "pg";

// The child sessions of workflow nodes: delegated sessions of the workflow's parent without a run row.

/** What a node's recovery checks of its child session: its kind, its parent and its principal. */
export interface NodeSessionRelation {
  readonly id: string;
  readonly kind: string;
  readonly parent: string | null;
  readonly principal: string;
}

/** The relations of several sessions in one read, keyed by id as PostgreSQL prints it; a missing one is absent. */
export async function nodeSessionRelations(
  pool: pg.Pool,
  ids: readonly string[],
): Promise<Map<string, NodeSessionRelation>> {
  const { rows } = await pool.query<NodeSessionRelation>(
    `select id::text as id, kind, parent_session_id::text as parent, principal_account_id::text as principal
         from sessions where id = any($1::uuid[])`,
    [ids],
  );
  return new Map(rows.map((r) => [r.id, r]));
}

export interface NewNodeSession {
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly model: string;
  /** Canonical JSON of the child's captured scope. */
  readonly scope: string;
}

/**
 * Creates a node's child with its planned id, or adopts the row of that id when it is the same planned
 * child (same parent and principal, nothing journaled yet; a process killed right after inserting it left
 * it), which then takes `model` and `scope`. Null when a session of that id is anything else.
 */
export async function createPlannedNodeSession(
  pool: pg.Pool,
  id: string,
  child: NewNodeSession,
): Promise<string | null> {
  const { rows } = await pool.query<{ id: string }>(
    `insert into sessions (id, kind, parent_session_id, principal_account_id, model, scope)
         values ($1::uuid, 'delegated', $2::uuid, $3::uuid, $4, $5)
         on conflict (id) do update set model = excluded.model, scope = excluded.scope
           where sessions.kind = 'delegated'
             and sessions.parent_session_id = excluded.parent_session_id
             and sessions.principal_account_id = excluded.principal_account_id
             and not exists (select 1 from journal_entries j where j.session_id = excluded.id)
         returning id`,
    [id, child.parentSessionId, child.principalAccountId, child.model, child.scope],
  );
  return rows[0] ? String(rows[0].id) : null;
}

/** Creates a node's child with a new id. */
export async function createNodeSession(pool: pg.Pool, child: NewNodeSession): Promise<string> {
  const { rows } = await pool.query<{ id: string }>(
    `insert into sessions (kind, parent_session_id, principal_account_id, model, scope)
       values ('delegated', $1::uuid, $2::uuid, $3, $4) returning id`,
    [child.parentSessionId, child.principalAccountId, child.model, child.scope],
  );
  return String(rows[0]?.id);
}
