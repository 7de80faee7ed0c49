import { createServer, type Server } from "node:net";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import {
  acquirePostgres,
  createDatabase,
  dropDatabase,
  uniqueDatabaseName,
  useTestDatabase,
} from "../src/pg/index.js";

describe("the PostgreSQL test harness", () => {
  const db = useTestDatabase();

  it("gives each test file its own database cloned from the migrated template", async () => {
    const { rows } = await db.pool.query<{ name: string }>("select current_database() as name");
    expect(rows[0]?.name).toMatch(/^crw_t_/);
    const migrated = await db.pool.query("select count(*)::int as n from pgmigrations");
    expect(migrated.rows[0].n).toBeGreaterThan(0);
  });

  it("keeps databases apart: a write in one is not seen in a sibling clone", async () => {
    await db.pool.query("create table scratch (v int)");
    const name = uniqueDatabaseName("crw_sibling");
    const url = await createDatabase(db.adminUrl, name);
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      const { rows } = await client.query("select to_regclass('scratch') as t");
      expect(rows[0].t).toBeNull();
    } finally {
      await client.end();
      await dropDatabase(db.adminUrl, name);
    }
  });
});

describe("CRW_PG=testcontainers without a Docker engine", () => {
  let silent: Server | undefined;
  const saved = {
    CRW_PG: process.env.CRW_PG,
    DOCKER_HOST: process.env.DOCKER_HOST,
    DATABASE_URL: process.env.DATABASE_URL,
  };
  afterAll(() => {
    silent?.close();
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });

  it("says so and falls back to an embedded server, even when DOCKER_HOST accepts and never answers", async () => {
    silent = createServer(() => {}).listen(0, "127.0.0.1");
    await new Promise((r) => silent?.once("listening", r));
    const address = silent.address();
    const port = typeof address === "object" && address ? address.port : 0;
    process.env.CRW_PG = "testcontainers";
    process.env.DOCKER_HOST = `tcp://127.0.0.1:${port}`;
    delete process.env.DATABASE_URL;
    const lines: string[] = [];
    const server = await acquirePostgres((line) => lines.push(line));
    try {
      expect(server.kind).toBe("embedded");
      expect(lines.join("\n")).toMatch(/falling back to embedded PostgreSQL/);
      const client = new pg.Client({ connectionString: server.adminUrl });
      await client.connect();
      const { rows } = await client.query("select 1 as one");
      await client.end();
      expect(rows[0].one).toBe(1);
    } finally {
      await server.stop();
    }
  });
});
