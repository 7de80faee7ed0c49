import { emptyDatabase, useTestDatabase } from "@crw/tools/pg";
import pg from "pg";
import { describe, expect, it } from "vitest";
import { migrate, migrationsTable } from "../src/index.js";

describe("migrations", () => {
  const db = useTestDatabase();

  it("the cloned test database carries the migrated schema", async () => {
    const { rows } = await db.pool.query<{ id: string }>("select id::text from installation");
    expect(rows).toHaveLength(1);
    expect(rows[0]?.id).toMatch(/^[0-9a-f-]{36}$/);
  });

  it("the installation row is a singleton", async () => {
    await expect(db.pool.query("insert into installation (singleton) values (false)")).rejects.toThrow(
      /check constraint/,
    );
  });

  it("migrate() runs every migration once on an empty database and nothing the second time", async () => {
    const empty = await emptyDatabase();
    try {
      const first = await migrate(empty.url);
      expect(first[0]).toBe("0001_installation");
      expect(await migrate(empty.url)).toEqual([]);
      const client = new pg.Client({ connectionString: empty.url });
      await client.connect();
      const { rows } = await client.query(`select name from ${migrationsTable} order by id`);
      await client.end();
      expect(rows.map((r) => r.name)).toEqual(first);
    } finally {
      await empty.drop();
    }
  });
});
