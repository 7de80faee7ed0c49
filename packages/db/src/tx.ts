import type pg from "pg";

/**
 * The SQLSTATEs a whole transaction is retried on, and only these: the database aborted it for a reason
 * another attempt can clear. Everything else (constraint violations included) surfaces at once.
 */
export const RETRYABLE_SQLSTATES: ReadonlySet<string> = new Set([
  "40001", // serialization_failure
  "40P01", // deadlock_detected
]);

const MAX_ATTEMPTS = 8;

export type Isolation = "read committed" | "repeatable read" | "serializable";

export interface Queryable {
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(
    text: string,
    values?: unknown[],
  ): Promise<pg.QueryResult<R>>;
}

/**
 * Runs `fn` in one transaction on a pooled client, retrying the whole of it on a listed SQLSTATE with a
 * short, growing, bounded backoff. `fn` must be safe to run again: it only talks to the database.
 */
export async function tx<T>(
  pool: pg.Pool,
  fn: (client: pg.PoolClient) => Promise<T>,
  options: { isolation?: Isolation; readOnly?: boolean } = {},
): Promise<T> {
  const begin = `begin isolation level ${options.isolation ?? "read committed"}${options.readOnly ? " read only" : ""}`;
  for (let attempt = 1; ; attempt++) {
    const client = await pool.connect();
    let broken = false;
    try {
      await client.query(begin);
      const value = await fn(client);
      await client.query("commit");
      return value;
    } catch (e) {
      await client.query("rollback").catch(() => {
        broken = true;
      });
      const code = (e as { code?: unknown }).code;
      if (typeof code === "string" && RETRYABLE_SQLSTATES.has(code) && attempt < MAX_ATTEMPTS) {
        await new Promise((r) => setTimeout(r, Math.min(200, 5 * 2 ** attempt) * Math.random()));
        continue;
      }
      throw e;
    } finally {
      client.release(broken);
    }
  }
}
