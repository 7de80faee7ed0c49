import { useTestDatabase } from "@crw/tools/pg";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { listenWhileConnected } from "../src/listen.js";

const db = useTestDatabase();
const pools: pg.Pool[] = [];
afterAll(async () => {
  for (const p of pools) await p.end();
});

describe("a listener held while its connection lasts", () => {
  it("a LISTEN that fails gives its connection back to the pool broken, and the open throws (no uncaught error of the ended connection)", async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 1 });
    pools.push(pool);
    const admin = new pg.Client({ connectionString: db.url });
    await admin.connect();
    try {
      // the backend the listener borrows is terminated before its LISTEN: a real failure of the statement
      const connect = pool.connect.bind(pool);
      pool.connect = (async () => {
        const client = await connect();
        // the end of the connection may be told while the client is still here, before it is the listener's
        client.on("error", () => {});
        const { rows } = await client.query<{ pid: number }>("select pg_backend_pid() as pid");
        await admin.query("select pg_terminate_backend($1)", [rows[0]?.pid]);
        pool.connect = connect;
        return client;
      }) as typeof pool.connect;
      await expect(listenWhileConnected(pool, "crw_test_listen", () => {})).rejects.toThrow();
      // the pool's one connection was given back: the next borrower gets a working one
      const answer = await Promise.race([
        pool.query("select 1 as one").then((r) => r.rows[0]?.one),
        new Promise((resolve) => setTimeout(() => resolve("pool exhausted"), 5_000)),
      ]);
      expect(answer).toBe(1);
    } finally {
      await admin.end();
    }
  });

  it("a listener whose connection the server ends gives it back broken: no uncaught error, the pool serves again", async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 1 });
    pools.push(pool);
    const listener = await listenWhileConnected(pool, "crw_test_listen_lost", () => {});
    const admin = new pg.Client({ connectionString: db.url });
    await admin.connect();
    try {
      const { rows } = await admin.query<{ pid: number }>(
        "select pid from pg_stat_activity where query = 'listen crw_test_listen_lost'",
      );
      expect(rows).toHaveLength(1);
      await admin.query("select pg_terminate_backend($1)", [rows[0]?.pid]);
      const answer = await Promise.race([
        pool.query("select 1 as one").then((r) => r.rows[0]?.one),
        new Promise((resolve) => setTimeout(() => resolve("pool exhausted"), 5_000)),
      ]);
      expect(answer).toBe(1);
      await listener.close();
    } finally {
      await admin.end();
    }
  });
});
