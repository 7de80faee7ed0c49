import { createPool } from "@crw/db";
import type pg from "pg";
import { afterAll, beforeAll, inject } from "vitest";
import { createDatabase, dropDatabase, uniqueDatabaseName } from "./databases.js";
import "./provided.js";

export { createDatabase, databaseUrl, dropDatabase, uniqueDatabaseName } from "./databases.js";
export { acquirePostgres, freePort, type PostgresServer } from "./server.js";

export interface TestDatabase {
  /** Connection string of this test file's own migrated database. */
  readonly url: string;
  /** A pool on it, ended after the file's tests. */
  readonly pool: pg.Pool;
  /** The server's admin connection string (to make more databases). */
  readonly adminUrl: string;
}

/**
 * A throw-away database for one test file, cloned from the run's migrated template (see global-setup.ts) and
 * dropped after the file. Call at the top of a test file; read the members inside tests.
 */
export function useTestDatabase(): TestDatabase {
  let state: { url: string; pool: pg.Pool; name: string } | undefined;
  const adminUrl = () => inject("crwPgAdminUrl");
  beforeAll(async () => {
    const name = uniqueDatabaseName("crw_t");
    const url = await createDatabase(adminUrl(), name, inject("crwPgTemplate"));
    state = { url, name, pool: createPool({ connectionString: url, max: 8 }) };
  });
  afterAll(async () => {
    if (!state) return;
    await state.pool.end();
    await dropDatabase(adminUrl(), state.name);
  });
  const need = () => {
    if (!state) throw new Error("useTestDatabase(): read its members inside a test, after beforeAll");
    return state;
  };
  return {
    get url() {
      return need().url;
    },
    get pool() {
      return need().pool;
    },
    get adminUrl() {
      return adminUrl();
    },
  };
}

/** A fresh, empty (unmigrated) database for tests of the migration path itself. */
export async function emptyDatabase(): Promise<{ url: string; drop: () => Promise<void> }> {
  const name = uniqueDatabaseName("crw_e");
  const url = await createDatabase(inject("crwPgAdminUrl"), name);
  return { url, drop: () => dropDatabase(inject("crwPgAdminUrl"), name) };
}
