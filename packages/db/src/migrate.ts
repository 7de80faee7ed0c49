import { resolve } from "node:path";

/** `migrations/` at the repository root: the only source of the schema (same depth from src/ and dist/). */
export const migrationsDir = resolve(import.meta.dirname, "../../../migrations");

export const migrationsTable = "pgmigrations";

/**
 * Runs every pending migration up, in file order (an out-of-order file is an error), each in its own
 * transaction, under node-pg-migrate's advisory lock so that daemons sharing a database migrate once.
 * Returns the names of the migrations it ran. The migration runner is imported here, on use: most processes
 * that load this package never migrate, and it cost each of them about 0.1 s of CPU to load.
 */
export async function migrate(databaseUrl: string): Promise<string[]> {
  const { runner } = await import("node-pg-migrate");
  const ran = await runner({
    databaseUrl,
    dir: migrationsDir,
    direction: "up",
    migrationsTable,
    count: Number.POSITIVE_INFINITY,
    checkOrder: true,
    log: () => {},
  });
  return ran.map((m) => m.name);
}
