import type pg from "pg";
import { DelegationDbError } from "../errors.js";
import type { Account, SessionRow } from "../repositories/delegation.js";
import { accountFromRow, assertUuid, notFound, type Row, sessionFromRow } from "./rows.js";

export async function createRootSession(
  pool: pg.Pool,
  principalAccountId: string,
  model: string,
  scope?: string,
): Promise<SessionRow> {
  assertUuid("principalAccountId", principalAccountId);
  try {
    const { rows } = await pool.query<Row>(
      `insert into sessions (kind, principal_account_id, model, scope) values ('root', $1::uuid, $2, $3) returning *`,
      [principalAccountId, model, scope ?? null],
    );
    return sessionFromRow(rows[0] as Row);
  } catch (e) {
    const code = (e as { code?: string }).code;
    if (code === "23503") throw notFound("account", { principalAccountId });
    if (code === "23514") throw new DelegationDbError("invalid_input", "model must be 1..200 characters", {});
    throw e;
  }
}

export async function getSession(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<SessionRow> {
  assertUuid("sessionId", sessionId);
  assertUuid("principalAccountId", principalAccountId);
  const { rows } = await pool.query<Row>(
    `select * from sessions where id = $1::uuid and principal_account_id = $2::uuid and visibility = 'visible'`,
    [sessionId, principalAccountId],
  );
  if (!rows[0]) throw notFound("session", { sessionId });
  return sessionFromRow(rows[0]);
}

/**
 * A visible session and its account (the live grant: tool_allow, tool_deny, permission settings) in one
 * snapshot, as getSession and getAccount would read them one after the other.
 */
export async function getSessionWithAccount(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<{ session: SessionRow; account: Account }> {
  assertUuid("sessionId", sessionId);
  assertUuid("principalAccountId", principalAccountId);
  const { rows } = await pool.query<Row>(
    `select s.*, to_jsonb(a) as account_row
       from sessions s left join accounts a on a.id = s.principal_account_id
      where s.id = $1::uuid and s.principal_account_id = $2::uuid and s.visibility = 'visible'`,
    [sessionId, principalAccountId],
  );
  const row = rows[0];
  if (!row) throw notFound("session", { sessionId });
  if (!row.account_row) throw notFound("account", { accountId: principalAccountId });
  return { session: sessionFromRow(row), account: accountFromRow(row.account_row as Row) };
}

/** The ownership guard: the child is visible only through a run of this parent, under this principal. */
export async function getChildSession(
  pool: pg.Pool,
  parentSessionId: string,
  childSessionId: string,
  principalAccountId: string,
): Promise<SessionRow> {
  assertUuid("parentSessionId", parentSessionId);
  assertUuid("childSessionId", childSessionId);
  assertUuid("principalAccountId", principalAccountId);
  const { rows } = await pool.query<Row>(
    `select s.* from sessions s
      where s.id = $2::uuid and s.parent_session_id = $1::uuid and s.principal_account_id = $3::uuid
        and s.visibility = 'visible'
        and exists (select 1 from subagent_runs r
                     where r.parent_session_id = $1::uuid and r.child_session_id = s.id)`,
    [parentSessionId, childSessionId, principalAccountId],
  );
  if (!rows[0]) throw notFound("child session", { parentSessionId, childSessionId });
  return sessionFromRow(rows[0]);
}

const MAX_DEPTH = 64;

export async function ancestry(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<SessionRow[]> {
  assertUuid("sessionId", sessionId);
  const { rows } = await pool.query<Row>(
    `with recursive up(id, depth, path) as (
       select parent_session_id, 1, array[id] from sessions where id = $1::uuid and principal_account_id = $2::uuid
       union all
       select s.parent_session_id, up.depth + 1, up.path || s.id
         from sessions s join up on s.id = up.id
        where up.depth < $3 and not s.id = any(up.path)
     )
     select s.*, up.depth, s.id = any(up.path) as cycle from up join sessions s on s.id = up.id order by up.depth`,
    [sessionId, principalAccountId, MAX_DEPTH + 1],
  );
  const out: SessionRow[] = [];
  for (const r of rows) {
    if (r.cycle) throw new DelegationDbError("invalid_input", "session ancestry has a cycle", { sessionId });
    if (String(r.principal_account_id) !== principalAccountId) {
      throw new DelegationDbError("cross_account", "session ancestry crosses accounts", { sessionId });
    }
    out.push(sessionFromRow(r));
  }
  if (out.length > MAX_DEPTH)
    throw new DelegationDbError("invalid_input", "session ancestry is too deep", { sessionId });
  return out;
}
