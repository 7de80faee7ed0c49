#!/usr/bin/env node
// Workflow boot-recovery benchmark (built code: run `npx tsup` in packages/db, packages/brain and
// plugins/subagent first). One engine starts W workflows of ten parallel nodes each and lets go while every
// node is mid-turn (W x 10 interrupted nodes, each a journaled child session); a second engine then boots
// on the same embedded PostgreSQL. Measures the time from the new engine's start (owner lease + recovery
// claim) to the first resumed node turn, and to every interrupted node resumed in its own child, the SQL
// statements per node of that recovery, and the floor it compares with, in the same run: p50 of an
// autocommit insert on the same server (one durable commit).
// Wake notifications as in the daemon, whose WakeHub knows nobody follows these workflows and sessions: no
// write notifies. CRW_BENCH_WAKE=all makes every write notify (a process that cannot tell; notifying
// commits are serialized by PostgreSQL's notify lock).
// DATABASE_URL, when set, is used instead of the embedded server. Prints one JSON object, then a summary.
// Usage: node bench/workflow-recovery.mjs [workflows]
import { randomUUID } from "node:crypto";
import { commitFloor, countStatements, startBenchPostgres } from "./lib/postgres.mjs";

const workflows = Number(process.argv[2] ?? 100);

// Count every statement sent through pg by this process.
const counter = await countStatements();
const db = await import("../packages/db/dist/index.js");
const wf = await import("../plugins/subagent/dist/index.js");
const wake = process.env.CRW_BENCH_WAKE === "all" ? "every write notifies" : "unwatched";
if (wake === "unwatched") db.addWakeFilter(() => false);

const pgServer = await startBenchPostgres("crw-bench-wfrec-", db.migrate);
const { url } = pgServer;
const pool = db.createPool({ connectionString: url, max: 16 });
// The embedded server stops at the end while idle clients may still be open: that is not a failure.
pool.on("error", () => {});
const repo = new db.PgDelegationRepository(pool);
const account = await repo.createAccount({ name: `bench-${randomUUID()}`, isOwner: true });

// The floor, on the same server in the same run: one durable commit.
const floorMs = (await commitFloor(url)).p50;
const definition = wf.parseWorkflowDefinition(
  JSON.stringify({
    name: "wide",
    nodes: Array.from({ length: 10 }, (_, i) => ({ id: `n${i}`, task: `TASK n${i}` })),
  }),
  "json",
);

let inFlight = 0;
const first = new wf.WorkflowEngine({
  pool,
  owner: `bench-a-${process.pid}`,
  repo,
  defaultModel: "scripted",
  dispatcher: new wf.JournalNodeDispatcher(
    repo,
    wf.scriptedNodeTurnRunner(async ({ signal }) => {
      inFlight++;
      await new Promise((_, reject) =>
        signal.addEventListener("abort", () => reject(new Error("lost")), { once: true }),
      );
    }),
  ),
});
await first.open();
const setupAt = performance.now();
for (let i = 0; i < workflows; i++) {
  const parent = await repo.createRootSession(account.id, "scripted");
  await first.start(
    {
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: `call-${i}`,
      currentAccess: async () => ({
        accountId: account.id,
        operator: true,
        target: { kind: "host", ref: null },
      }),
      currentWorkDir: async () => null,
      ...wf.hostAccessors(),
    },
    { definition },
  );
}
const interrupted = workflows * 10;
while (inFlight < interrupted) await new Promise((r) => setTimeout(r, 10));
const setupMs = performance.now() - setupAt;
await first.close(); // the process lets go: every node stays running in its journal

let resumed = 0;
let firstResumedAt = 0;
let allResumed;
const everyone = new Promise((r) => {
  allResumed = r;
});
const statementsBefore = counter.count();
let statementsAtAll = 0;
const bootAt = performance.now();
const second = new wf.WorkflowEngine({
  pool,
  owner: `bench-b-${process.pid}`,
  repo,
  defaultModel: "scripted",
  dispatcher: new wf.JournalNodeDispatcher(
    repo,
    wf.scriptedNodeTurnRunner(async () => {
      resumed++;
      if (resumed === 1) firstResumedAt = performance.now();
      if (resumed === interrupted) {
        statementsAtAll = counter.count();
        allResumed(performance.now());
      }
      return "resumed";
    }),
  ),
});
await second.open();
const report = await second.recoverInterrupted(workflows + 10);
const allAt = await everyone;
const recoverCallMs = performance.now() - bootAt;
await Promise.all(report.resumed.map((id) => second.finished(id)));
const { rows } = await pool.query("select count(*)::int n from sessions where kind = 'delegated'");
if (rows[0].n !== interrupted) throw new Error(`expected ${interrupted} children, found ${rows[0].n}`);
await second.close();
await pool.end();
await pgServer.stop();

const result = {
  bench: "workflow-recovery",
  postgres: pgServer.external ? "external" : "embedded (durable defaults)",
  wake,
  workflows,
  interruptedNodes: interrupted,
  setupMs: Math.round(setupMs),
  bootToFirstResumedNodeMs: Math.round(firstResumedAt - bootAt),
  bootToAllResumedMs: Math.round(allAt - bootAt),
  recoverCallMs: Math.round(recoverCallMs),
  commitFloorMs: { p50: floorMs },
  sqlStatementsPerNodeUntilAllResumed: Number(
    ((statementsAtAll - statementsBefore) / interrupted).toFixed(1),
  ),
  childSessions: rows[0].n,
};
console.log(JSON.stringify(result));
console.log(
  `workflow-recovery (${wake}): ${interrupted} interrupted nodes in ${workflows} workflows; boot to first resumed node ` +
    `${result.bootToFirstResumedNodeMs} ms, to all resumed (each in its own child, none twice) ${result.bootToAllResumedMs} ms ` +
    `(${result.sqlStatementsPerNodeUntilAllResumed} statements per node; commit floor ${floorMs} ms)`,
);
