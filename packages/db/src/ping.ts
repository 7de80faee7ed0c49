import type pg from "pg";

/**
 * Whether the database answers one trivial statement within `timeoutMs`: the error that says why not, or
 * null. A server that accepts the connection but never answers counts as down (the timeout), so a hung
 * database is noticed like a dead one.
 */
export async function pingDatabase(pool: pg.Pool, timeoutMs: number): Promise<Error | null> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<Error>((resolve) => {
    timer = setTimeout(() => resolve(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
  });
  try {
    return await Promise.race([
      pool.query("select 1").then(
        () => null,
        (e: unknown) => (e instanceof Error ? e : new Error(String(e))),
      ),
      late,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A driver failure that means the database cannot be reached now (refused or lost connection, a server
 * shutting down or starting, a connection timeout), not that a statement was wrong.
 */
export function isDatabaseUnavailable(e: unknown): boolean {
  const err = e as { code?: unknown; message?: unknown } | null;
  if (typeof err !== "object" || err === null) return false;
  const code = typeof err.code === "string" ? err.code : "";
  if (/^(08|57P0[1-4])/.test(code)) return true;
  if (["ECONNREFUSED", "ECONNRESET", "EPIPE", "ETIMEDOUT", "ENOTFOUND", "EHOSTUNREACH"].includes(code))
    return true;
  const message = typeof err.message === "string" ? err.message : "";
  return /Connection terminated|connection timeout|Client has encountered a connection error|the database system is (starting up|shutting down|in recovery mode)/i.test(
    message,
  );
}
