import { useTestDatabase } from "@crw/tools/pg";
import { afterAll, describe, expect, it, vi } from "vitest";
import { createPool } from "../src/index.js";

const db = useTestDatabase();
const pools: { end(): Promise<void> }[] = [];
afterAll(async () => {
  for (const p of pools) await p.end();
});

const preparedOn = async (client: { query: (t: string) => Promise<{ rows: { name: string }[] }> }) =>
  (await client.query("select name from pg_prepared_statements")).rows.map((r) => r.name);

describe("the repositories' pool prepares its statements", () => {
  it("a parameterized statement is prepared once per connection and reused; one without parameters is not", async () => {
    const pool = createPool({ connectionString: db.url, max: 1 });
    pools.push(pool);
    const client = await pool.connect();
    try {
      expect(await preparedOn(client)).toEqual([]);
      const first = await client.query("select $1::int + 1 as n", [41]);
      const second = await client.query("select $1::int + 1 as n", [1]);
      expect([first.rows[0].n, second.rows[0].n]).toEqual([42, 2]);
      await client.query("select 1");
      const names = await preparedOn(client);
      expect(names).toHaveLength(1);
      expect(names[0]).toMatch(/^crw_/);
      // a second text is a second statement
      await client.query("select $1::text as t", ["x"]);
      expect(await preparedOn(client)).toHaveLength(2);
    } finally {
      client.release();
    }
  });

  it("a failed statement is refused as usual and leaves the connection usable", async () => {
    const pool = createPool({ connectionString: db.url, max: 1 });
    pools.push(pool);
    await expect(pool.query("select $1::int from no_such_table", [1])).rejects.toMatchObject({
      code: "42P01",
    });
    await expect(pool.query("select $1::int + 1 as n", [1])).resolves.toMatchObject({ rows: [{ n: 2 }] });
  });

  it("a connection keeps at most 512 prepared statements: texts past that run unnamed", async () => {
    const pool = createPool({ connectionString: db.url, max: 1 });
    pools.push(pool);
    const client = await pool.connect();
    try {
      for (let i = 0; i < 520; i++) {
        const { rows } = await client.query(`select $1::int + ${i} as n`, [1]);
        expect(rows[0].n).toBe(1 + i);
      }
      expect(await preparedOn(client)).toHaveLength(512);
    } finally {
      client.release();
    }
  });

  it("an idle connection is kept past pg's 10 s idle bound: the same server backend, its statements still prepared", async () => {
    const pool = createPool({ connectionString: db.url, max: 1 });
    pools.push(pool);
    const client = await pool.connect();
    const backend = (await client.query("select pg_backend_pid() as pid, $1::int as n", [1])).rows[0].pid;
    // the idle bound's timer is set as the client goes back to the pool: pg's own clock, moved on 11 s
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    try {
      client.release();
      vi.advanceTimersByTime(11_000);
    } finally {
      vi.useRealTimers();
    }
    expect(pool.totalCount).toBe(1);
    const again = await pool.connect();
    try {
      const { rows } = await again.query("select pg_backend_pid() as pid, $1::int as n", [2]);
      expect(rows[0]).toEqual({ pid: backend, n: 2 });
      expect(await preparedOn(again)).toHaveLength(1);
    } finally {
      again.release();
    }
  });
});
