import { captureDelegatedExecutionScope } from "@crw/brain";
import { PgDelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import { steps, TestClient } from "../support/client.js";
import { healthWith } from "../support/health.js";
import { spawnDaemon } from "../support/process.js";

const db = useTestDatabase();

/**
 * Several daemons on one PostgreSQL coordinate through rows only: two daemon processes boot at the same time
 * over the same interrupted calls; each call is claimed by exactly one of them (for update skip locked under
 * owner leases), continued once (uncharged: each was waiting on its model), and its result delivered once.
 * A workflow started on one daemon is visible, with its nodes and summary, through the other.
 */
describe("daemons sharing one PostgreSQL", () => {
  it("two daemons booting together split the interrupted calls between them, each continued exactly once", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const account = await repo.createAccount({ name: `shared-${Date.now()}` });
    const parent = await repo.createRootSession(account.id, "scripted");
    const scope = captureDelegatedExecutionScope({
      accountId: account.id,
      target: { kind: "host", ref: null },
    });
    const n = 24;
    for (let i = 0; i < n; i++) {
      const { run } = await repo.createDelegation({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: `shared-${i}`,
        task: steps({ text: `child ${i} recovered` }),
        mode: "background",
        model: "scripted",
        scope,
      });
      await repo.startRun(run.id, run.generation, "an-owner-that-died");
    }
    const opts = (name: string) => ({
      dataDir: scratchDir(`crw-shared-${name}-`),
      databaseUrl: db.url,
      runtime: { maxRunners: 1, turnsPerRunner: 8 },
    });
    const [a, b] = await Promise.all([spawnDaemon(opts("a")), spawnDaemon(opts("b"))]);
    try {
      const reports = await Promise.all(
        [a, b].map(async (d) => {
          const h = (await healthWith(d.url, d.token)) as {
            recovery: { delegations: { continued: string[] } };
          };
          return h.recovery.delegations.continued;
        }),
      );
      const all = reports.flat();
      expect(new Set(all).size).toBe(all.length);
      expect(all.length).toBe(n);
      const until = Date.now() + 60_000;
      for (;;) {
        const { rows } = await db.pool.query(
          `select count(*) filter (where status = 'succeeded')::int as ok,
                  count(*) filter (where recovery_attempts + free_continuations <> 1)::int as recharged
             from subagent_runs where parent_session_id = $1::uuid`,
          [parent.id],
        );
        const acks = await db.pool.query(
          "select count(*)::int as n from delegation_result_acks where parent_session_id = $1::uuid",
          [parent.id],
        );
        expect(rows[0].recharged).toBe(0);
        if (rows[0].ok === n && acks.rows[0].n === n) break;
        if (Date.now() > until) throw new Error(`not settled: ${JSON.stringify(rows[0])}`);
        await new Promise((r) => setTimeout(r, 100));
      }
      const dup = await db.pool.query(
        "select result_id from journal_entries where session_id = $1::uuid and result_id is not null and not discarded group by result_id having count(*) > 1",
        [parent.id],
      );
      expect(dup.rows).toEqual([]);

      // A workflow started through A is read, with its nodes and its summary, through B: the rows are the truth.
      const ca = await TestClient.connect(a.url, a.token);
      // Tokens live in the shared database: A's owner token authenticates on B too.
      const cb = await TestClient.connect(b.url, a.token);
      try {
        const started = await ca.ok<{ workflowId: string }>("workflow.start", {
          format: "json",
          definition: JSON.stringify({
            name: "shared",
            nodes: [
              { id: "one", task: "first" },
              { id: "two", task: "second", dependsOn: ["one"] },
            ],
          }),
        });
        const followed = await cb.ok<{
          status: string;
          summary: string;
          nodes: { id: string; status: string }[];
        }>("workflow.follow", { workflowId: started.workflowId });
        expect(followed.status).toBe("completed");
        expect(followed.nodes.map((x) => x.status)).toEqual(["succeeded", "succeeded"]);
        expect(followed.summary).toContain("- two: succeeded");
      } finally {
        ca.close();
        cb.close();
      }
    } finally {
      for (const d of [a, b]) d.child.kill("SIGTERM");
      await Promise.all([a.exited, b.exited]);
    }
  }, 120_000);
});
