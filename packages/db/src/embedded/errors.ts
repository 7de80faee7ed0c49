/**
 * Why an embedded PostgreSQL could not be made, started or reached:
 * - `server_user`: as root, no unprivileged user to run the server as (PostgreSQL refuses to run as root)
 * - `binaries`: the server binaries cannot be found or executed (a file system mounted noexec, say)
 * - `data_dir`: the data directory cannot be made or reached by the user the server runs as
 * - `initdb`: initdb failed on a directory it could reach
 * - `start`: the server exited, or did not say it was ready within the bound
 */
export type EmbeddedPostgresReason = "server_user" | "binaries" | "data_dir" | "initdb" | "start";

export class EmbeddedPostgresError extends Error {
  override readonly name = "EmbeddedPostgresError";
  readonly code = "embedded_postgres_failed";
  /** Nothing here heals by itself: each reason needs a change on the machine or in the configuration. */
  readonly retryable = false;
  constructor(
    readonly reason: EmbeddedPostgresReason,
    message: string,
    readonly context: Readonly<Record<string, unknown>> = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** What a user can do about any of them, besides the specific fix each message names. */
export const EXTERNAL_SERVER_HINT = "or set DATABASE_URL to a PostgreSQL server of your own";
