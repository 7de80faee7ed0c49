import type pg from "pg";
import { DelegationDbError } from "../errors.js";
import type { Account, NewAccount } from "../repositories/delegation.js";
import { tx } from "../tx.js";
import { accountFromRow, assertUuid, notFound, type Row } from "./rows.js";

export async function createAccount(pool: pg.Pool, input: NewAccount): Promise<Account> {
  try {
    const { rows } = await pool.query<Row>(
      `insert into accounts (name, tool_allow, tool_deny, permission_settings, is_owner, is_administrator)
       values ($1, $2::text[], $3::text[], $4::jsonb, $5, $6) returning *`,
      [
        input.name,
        input.toolAllow === undefined ? null : input.toolAllow,
        input.toolDeny ?? [],
        JSON.stringify(input.permissionSettings ?? {}),
        input.isOwner ?? false,
        input.isAdministrator ?? false,
      ],
    );
    return accountFromRow(rows[0] as Row);
  } catch (e) {
    const code = (e as { code?: string }).code;
    if (code === "23505")
      throw new DelegationDbError("conflict", "an account with this name exists", { name: input.name });
    if (code === "23514")
      throw new DelegationDbError("invalid_input", "account name must be 1..200 characters", {});
    throw e;
  }
}

export async function getAccount(pool: pg.Pool, accountId: string): Promise<Account> {
  assertUuid("accountId", accountId);
  const { rows } = await pool.query<Row>("select * from accounts where id = $1::uuid", [accountId]);
  if (!rows[0]) throw notFound("account", { accountId });
  return accountFromRow(rows[0]);
}

export async function addApiToken(
  pool: pg.Pool,
  accountId: string,
  tokenHash: Buffer,
  label = "",
): Promise<void> {
  assertUuid("accountId", accountId);
  if (tokenHash.length !== 32)
    throw new DelegationDbError("invalid_input", "a token hash is 32 bytes (sha-256)", {});
  await pool.query(
    `insert into account_api_tokens (token_hash, account_id, label) values ($1, $2::uuid, $3)`,
    [tokenHash, accountId, label],
  );
}

export async function accountByTokenHash(pool: pg.Pool, tokenHash: Buffer): Promise<Account | null> {
  const { rows } = await pool.query<Row>(
    `select a.* from account_api_tokens t join accounts a on a.id = t.account_id
      where t.token_hash = $1 and t.revoked_at is null`,
    [tokenHash],
  );
  return rows[0] ? accountFromRow(rows[0]) : null;
}

export async function accountByName(pool: pg.Pool, name: string): Promise<Account | null> {
  const { rows } = await pool.query<Row>("select * from accounts where name = $1", [name]);
  return rows[0] ? accountFromRow(rows[0]) : null;
}

export async function listAccounts(pool: pg.Pool): Promise<(Account & { createdAt: Date })[]> {
  const { rows } = await pool.query<Row>("select * from accounts order by created_at, name");
  return rows.map((r) => ({ ...accountFromRow(r), createdAt: r.created_at as Date }));
}

/** Sets an account's tool grants (allow null: every tool the host offers; deny: refused even if allowed). */
export async function setAccountGrants(
  pool: pg.Pool,
  accountId: string,
  grants: { toolAllow: readonly string[] | null; toolDeny: readonly string[] },
): Promise<Account> {
  assertUuid("accountId", accountId);
  const { rows } = await pool.query<Row>(
    "update accounts set tool_allow = $2::text[], tool_deny = $3::text[] where id = $1::uuid returning *",
    [accountId, grants.toolAllow, grants.toolDeny],
  );
  if (!rows[0]) throw notFound("account", { accountId });
  return accountFromRow(rows[0]);
}

/** The transaction-scoped lock under which the installation's owner account is made, once per database. */
const OWNER_ACCOUNT_LOCK = [7306, 1] as const;

/**
 * The installation's owner account: the oldest owner account of the database, made by the first daemon
 * that finds none. Daemons booting together on one database serialize on a transaction lock, so exactly
 * one makes it and the others read it.
 */
export function ensureOwnerAccount(pool: pg.Pool): Promise<Account> {
  return tx(pool, async (c) => {
    await c.query("select pg_advisory_xact_lock($1, $2)", [...OWNER_ACCOUNT_LOCK]);
    const found = await c.query<Row>("select * from accounts where is_owner order by created_at, id limit 1");
    if (found.rows[0]) return accountFromRow(found.rows[0]);
    // "owner" may already name an ordinary account someone made: the owner then takes the next free name
    const { rows } = await c.query<Row>(
      `insert into accounts (name, is_owner, is_administrator)
       select n, true, true from (
         select case when i = 0 then 'owner' else 'owner-' || (i + 1) end as n, i
           from generate_series(0, 100) as i) names
        where not exists (select 1 from accounts a where a.name = names.n)
        order by i limit 1
       returning *`,
    );
    if (!rows[0]) throw new DelegationDbError("conflict", "no free name for the owner account", {});
    return accountFromRow(rows[0]);
  });
}
