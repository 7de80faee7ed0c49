import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { settleRun } from "../src/delegation/runs.js";
import { PgDelegationRepository } from "../src/index.js";

const db = useTestDatabase();

describe("a settlement that waited for another one's lock", () => {
  it("is told the result that committed first, not refused as stale", async () => {
    const r = new PgDelegationRepository(db.pool);
    const account = await r.createAccount({ name: `sr-${randomUUID().slice(0, 8)}` });
    const parent = await r.createRootSession(account.id, "scripted");
    const { run } = await r.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "raced",
      task: "t",
      mode: "background",
      model: "scripted",
      scope: "{}",
    });
    const settlement = (resultId: string) => ({
      runId: run.id,
      generation: run.generation,
      resultId,
      outcome: "ok" as const,
      body: "",
      byteSize: 0,
    });
    const first = randomUUID();
    const client = await db.pool.connect();
    try {
      // the first settlement holds the run's row lock in a transaction that has not committed yet
      await client.query("begin");
      expect(await settleRun(client as unknown as pg.Pool, settlement(first))).toEqual({
        settled: true,
        resultId: first,
      });
      // the second starts now: its statement's snapshot predates the first's commit, then it waits
      const second = r.settleRun(settlement(randomUUID()));
      await expect
        .poll(async () => {
          const { rows } = await db.pool.query<{ n: number }>(
            `select count(*)::int as n from pg_stat_activity
              where datname = current_database() and wait_event_type = 'Lock' and query like '%delegation_results%'`,
          );
          return rows[0]?.n;
        })
        .toBe(1);
      await client.query("commit");
      expect(await second).toEqual({ settled: false, resultId: first });
    } finally {
      client.release();
    }
    expect(
      (await db.pool.query("select id from delegation_results where run_id = $1", [run.id])).rows.map(
        (x) => x.id,
      ),
    ).toEqual([first]);
  });
});
