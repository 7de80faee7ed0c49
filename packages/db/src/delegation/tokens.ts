import type pg from "pg";
import { DelegationDbError } from "../errors.js";
import { type ChannelListener, listenOnChannel } from "../listen.js";
import type { ApiTokenView } from "../repositories/delegation.js";
import { tx } from "../tx.js";
import { assertUuid, type Row } from "./rows.js";

/**
 * API tokens: only a token's sha-256 is stored; its id is the hash's first six bytes in hex (what lists
 * show and revoke takes, never enough to authenticate). A revocation is committed with a notification on
 * TOKEN_REVOKED_CHANNEL naming the whole hash, so every daemon on the database drops the connections it
 * opened with that token at once.
 */
export const TOKEN_REVOKED_CHANNEL = "crw_token_revoked";
const TOKEN_ID = /^[0-9a-f]{12}$/;

const tokenFromRow = (r: Row): ApiTokenView => ({
  id: String(r.id),
  accountId: String(r.account_id),
  accountName: String(r.account_name),
  label: String(r.label ?? ""),
  createdAt: r.created_at as Date,
  revokedAt: (r.revoked_at as Date | null) ?? null,
});

export async function listApiTokens(pool: pg.Pool, accountId?: string): Promise<ApiTokenView[]> {
  if (accountId !== undefined) assertUuid("accountId", accountId);
  const { rows } = await pool.query<Row>(
    `select encode(substring(t.token_hash from 1 for 6), 'hex') as id, t.account_id, a.name as account_name,
            t.label, t.created_at, t.revoked_at
       from account_api_tokens t join accounts a on a.id = t.account_id
      where $1::uuid is null or t.account_id = $1::uuid
      order by t.created_at, t.token_hash`,
    [accountId ?? null],
  );
  return rows.map(tokenFromRow);
}

/** Revokes one token by its id; the notification is sent on commit. Answers the token as it now is. */
export function revokeApiToken(pool: pg.Pool, tokenId: string): Promise<ApiTokenView> {
  if (!TOKEN_ID.test(tokenId))
    throw new DelegationDbError("invalid_input", "a token id is 12 hexadecimal characters", { tokenId });
  return tx(pool, async (c) => {
    const { rows } = await c.query<Row>(
      `update account_api_tokens t set revoked_at = coalesce(t.revoked_at, now())
         from accounts a
        where a.id = t.account_id and substring(t.token_hash from 1 for 6) = decode($1, 'hex')
        returning encode(substring(t.token_hash from 1 for 6), 'hex') as id, encode(t.token_hash, 'hex') as hash,
                  t.account_id, a.name as account_name, t.label, t.created_at, t.revoked_at`,
      [tokenId],
    );
    if (rows.length === 0) throw new DelegationDbError("not_found", `no token ${tokenId}`, { tokenId });
    if (rows.length > 1)
      throw new DelegationDbError("conflict", `token id ${tokenId} names more than one token`, { tokenId });
    const row = rows[0] as Row;
    await c.query("select pg_notify($1, $2)", [TOKEN_REVOKED_CHANNEL, String(row.hash)]);
    return tokenFromRow(row);
  });
}

/** Of the given token hashes, the ones that no longer authenticate (revoked, or gone with their account). */
export async function unusableTokenHashes(pool: pg.Pool, hashes: readonly Buffer[]): Promise<Buffer[]> {
  if (hashes.length === 0) return [];
  const { rows } = await pool.query<{ h: Buffer }>(
    `select h from unnest($1::bytea[]) as h
      where not exists (select 1 from account_api_tokens t where t.token_hash = h and t.revoked_at is null)`,
    [hashes],
  );
  return rows.map((r) => r.h);
}

export type RevocationListener = ChannelListener;

/**
 * Listens for revocations: `onRevoked` gets each revoked hash (hex); `onListening` runs each time the
 * listener is (again) in place, so a caller can re-check what a lost connection may have missed.
 */
export function listenForRevocations(
  pool: pg.Pool,
  onRevoked: (hashHex: string) => void,
  onListening: () => void,
  onError: (e: unknown) => void,
): Promise<RevocationListener> {
  return listenOnChannel(pool, TOKEN_REVOKED_CHANNEL, { onPayload: onRevoked, onListening, onError });
}
