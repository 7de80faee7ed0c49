import type pg from "pg";
import { DelegationDbError } from "../errors.js";
import type { Account, NewAccount } from "../repositories/delegation.js";
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
