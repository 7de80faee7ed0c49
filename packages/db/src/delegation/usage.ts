import type pg from "pg";
import type { ProviderUsage } from "../repositories/journal.js";
import { assertUuid } from "./rows.js";

/** One provider response of a session's turn, as the process that made the request reports it. */
export interface ProviderUsageReport {
  readonly sessionId: string;
  readonly turnId: string;
  readonly runnerId: string;
  readonly usage: ProviderUsage;
}

/** Records one provider response's usage (a row of its own per response, never merged). */
export async function recordProviderUsage(pool: pg.Pool, report: ProviderUsageReport): Promise<void> {
  assertUuid("sessionId", report.sessionId);
  const u = report.usage;
  await pool.query(
    `insert into provider_usage (session_id, turn_id, runner_id, api, provider, model, stop_reason,
       input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, total_tokens, cost)
     values ($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
    [
      report.sessionId,
      report.turnId,
      report.runnerId,
      u.api,
      u.provider,
      u.model,
      u.stopReason,
      u.input,
      u.output,
      u.cacheRead,
      u.cacheWrite,
      u.totalTokens,
      u.cost ?? 0,
    ],
  );
}

/** The account a session belongs to, or null when there is no such session. */
export async function sessionPrincipal(pool: pg.Pool, sessionId: string): Promise<string | null> {
  assertUuid("sessionId", sessionId);
  const { rows } = await pool.query<{ principal: string }>(
    "select principal_account_id::text as principal from sessions where id = $1::uuid",
    [sessionId],
  );
  return rows[0]?.principal ?? null;
}
