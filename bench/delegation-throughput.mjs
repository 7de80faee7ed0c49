#!/usr/bin/env node
// Delegation-core benchmark (built code: run `npx tsup` in packages/db and packages/brain first).
// With the offline scripted runner at zero latency on a real embedded PostgreSQL (durable defaults: fsync
// and synchronous_commit on), measures:
//   - background delegations per second, each one created, run, settled, delivered exactly once into its
//     idle parent and answered by the parent's batched follow-up turn,
//   - settle-to-delivered latency p50/p99 (result committed to the inbox -> parent journal commit),
//   - SQL statements and rows written per delegation.
// By default every delegation is made at once (a burst: the figures are those of a saturated process);
// with a rate, delegations are made at that many per second over all parents, so settle-to-delivered is
// the path's own latency rather than its queue.
// Wake notifications as in the daemon, whose WakeHub knows nobody taps these sessions: no write notifies.
// CRW_BENCH_WAKE=all makes every write notify (notifying commits are serialized by PostgreSQL).
// DATABASE_URL, when set, is used instead of the embedded server. Prints one JSON object, then a summary.
// Usage: node bench/delegation-throughput.mjs [parents] [delegations-per-parent] [rate-per-second]
// The machine's CPU per delegation is every process's (this one and PostgreSQL's backends) over the burst.
// (CRW_BENCH_SERVER_STATEMENTS=1: the server's time by statement, to stderr; see lib/postgres.mjs)
import pg from "pg";
import { measuredDelegationService } from "./lib/delegation.mjs";
import { cpuUnitMs, machineSpan } from "./lib/machine.mjs";
import {
  commitFloor,
  countStatements,
  reportServerStatements,
  resetServerStatements,
  serverCpuSpan,
  startBenchPostgres,
} from "./lib/postgres.mjs";

const parents = Number(process.argv[2] ?? 8);
const perParent = Number(process.argv[3] ?? 25);
const rate = process.argv[4] ? Number(process.argv[4]) : null;
const db = await import("../packages/db/dist/index.js");
const brain = await import("../packages/brain/dist/index.js");
const wake = process.env.CRW_BENCH_WAKE === "all" ? "every write notifies" : "unwatched";
if (wake === "unwatched") db.addWakeFilter(() => false);

const pgServer = await startBenchPostgres("crw-bench-deleg-", db.migrate);
const { work, url } = pgServer;
// The floor, on the same server before the run: one durable commit.
const floor = await commitFloor(url);
// and the machine's speed at the moment (a fixed piece of JavaScript), to read the figures of another day against
const cpuUnit = cpuUnitMs();

// Count every statement sent through pg by this process.
const counter = await countStatements();

const { pool, service, latencies, metTurn, idleParent } = await measuredDelegationService({
  db,
  brain,
  url,
  work,
});

const admin = new pg.Client({ connectionString: url });
await admin.connect();
async function rowsWritten() {
  // A backend reports its row counts when idle at most once a second (else ten seconds later), so each
  // idle pooled connection is asked to flush now: it does so before it answers the request.
  const held = await Promise.all(Array.from({ length: pool.idleCount }, () => pool.connect()));
  for (const c of held) {
    await c.query("select pg_stat_force_next_flush()");
    c.release();
  }
  await admin.query("select pg_stat_force_next_flush()");
  const { rows } = await admin.query(
    "select tup_inserted + tup_updated + tup_deleted as n from pg_stat_database where datname = current_database()",
  );
  return Number(rows[0].n);
}

const sessions = [];
for (let p = 0; p < parents; p++) {
  const account = await service.repo.createAccount({ name: `bench-${p}` });
  const parent = await service.createRootSession(account.id, "scripted");
  sessions.push({ account, parent });
}
/**
 * A wait for deliveries that ends the bench with an error after two minutes: a delegation whose statement
 * failed (its connection lost) is never delivered, and the bench would otherwise wait for ever.
 */
function boundedWait(what) {
  const until = performance.now() + 120_000;
  return () => {
    if (performance.now() > until) {
      console.error(`${what}: not all delivered within 120 s`);
      process.exit(1);
    }
  };
}
// CRW_BENCH_WARMUP=N: N delegations per parent run and delivered before the measured burst (the figures
// of a process that has run some already: statements prepared on its connections, code compiled)
const warmup = Number(process.env.CRW_BENCH_WARMUP ?? 0);
/** One background delegation of `parent`, answered at once by the scripted child. */
const delegateFrom = ({ account, parent }, id) =>
  service.delegate({
    parentSessionId: parent.id,
    principalAccountId: account.id,
    toolCallId: id,
    task: brain.scriptTask({ answer: `result of ${id}` }),
    mode: "background",
  });
if (warmup > 0) {
  const runs = sessions.flatMap((s) =>
    Array.from({ length: warmup }, (_, i) => delegateFrom(s, `warm-${i}`)),
  );
  await Promise.all(runs);
  for (const bound = boundedWait("the warm-up's deliveries"); ; bound()) {
    await service.whenIdle();
    const { rows } = await admin.query("select count(*)::int as n from delegation_result_acks");
    if (rows[0].n >= parents * warmup) break;
    await new Promise((r) => setTimeout(r, 10));
  }
  latencies.length = 0;
  metTurn.length = 0;
  idleParent.length = 0;
}
// CRW_BENCH_IDLE_MS=N: the process idles that long between the warm-up and the measured burst, as a daemon
// does between bursts of work (what its pool keeps over the pause is what the burst finds)
const idleMs = Number(process.env.CRW_BENCH_IDLE_MS ?? 0);
if (idleMs > 0) await new Promise((r) => setTimeout(r, idleMs));
const rowsBefore = await rowsWritten();
await resetServerStatements(admin);
const statementsBefore = counter.count();
const started = performance.now();
const cpuBefore = process.cpuUsage();
const machine = machineSpan();
const server = await serverCpuSpan(admin, pgServer.external);
const delegations = sessions.flatMap((s) =>
  Array.from({ length: perParent }, (_, i) => () => delegateFrom(s, `bench-${i}`)),
);
const made = [];
for (const [n, delegate] of delegations.entries()) {
  if (rate) {
    const due = started + (n * 1000) / rate;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  }
  made.push(delegate());
}
await Promise.all(made);
const total = parents * perParent;
for (const bound = boundedWait("the burst's deliveries"); ; bound()) {
  await service.whenIdle();
  const { rows } = await admin.query(
    "select count(*)::int as n from delegation_results r join delegation_result_acks a on a.result_id = r.id",
  );
  if (rows[0].n >= total + parents * warmup) break;
  await new Promise((r) => setTimeout(r, 10));
}
await service.whenIdle();
const elapsedMs = performance.now() - started;
const cpu = process.cpuUsage(cpuBefore);
const statementsUsed = counter.count() - statementsBefore;
const serverCpuMs = await server.perUnit(total);
counter.report?.(total);
await reportServerStatements(admin, total);
const rowsUsed = (await rowsWritten()) - rowsBefore;

const dup = await admin.query(
  "select count(*)::int as n from (select session_id, result_id from journal_entries where result_id is not null group by 1, 2 having count(*) > 1) d",
);
const pctOf = (values, q) => {
  const sorted = [...values].sort((a, b) => a - b);
  const v = sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
  return v === undefined ? null : Math.round(v * 10) / 10;
};
const pct = (q) => pctOf(latencies, q);
const out = {
  bench: "delegation-throughput",
  postgres: process.env.DATABASE_URL ? "external" : "embedded (durable defaults)",
  parents,
  delegationsPerParent: perParent,
  ratePerSecond: rate ?? "burst",
  warmupPerParent: warmup,
  idleBeforeMs: idleMs,
  wake,
  delegations: total,
  elapsedMs: Math.round(elapsedMs),
  delegationsPerSecond: Math.round((total / elapsedMs) * 1000 * 10) / 10,
  settleToDeliveredMs: { p50: pct(0.5), p99: pct(0.99), samples: latencies.length },
  // the path's own latency: the results whose parent was idle when they settled
  settleToDeliveredIdleParentMs: {
    p50: pctOf(idleParent, 0.5),
    p99: pctOf(idleParent, 0.99),
    samples: idleParent.length,
  },
  // the results that settled while their parent held a turn: they wait for it to end
  settleToDeliveredMetParentTurnMs: {
    p50: pctOf(metTurn, 0.5),
    p99: pctOf(metTurn, 0.99),
    samples: metTurn.length,
  },
  sqlStatementsPerDelegation: Math.round((statementsUsed / total) * 10) / 10,
  rowsWrittenPerDelegation: Math.round((rowsUsed / total) * 10) / 10,
  duplicateDeliveries: dup.rows[0].n,
  floor: { commitMs: floor, cpuUnitMs: cpuUnit },
  // this process's own CPU (the delegation core and the pg client; the server's is not in it)
  clientCpuMsPerDelegation: Math.round(((cpu.user + cpu.system) / 1000 / total) * 100) / 100,
  // of it in the kernel (socket writes and reads to the server, file writes of the spill store)
  clientSystemCpuMsPerDelegation: Math.round((cpu.system / 1000 / total) * 100) / 100,
  // every process's CPU on the machine over the same span (this process, PostgreSQL's, anything else)
  machineCpuMsPerDelegation: machine.perUnit(total),
  // PostgreSQL's processes alone (a neighbour's work on the machine is not in it)
  serverCpuMsPerDelegation: serverCpuMs,
};
console.log(JSON.stringify(out));
console.log(
  `${out.delegations} delegations: ${out.delegationsPerSecond}/s, settle->delivered p50 ${out.settleToDeliveredMs.p50} ms p99 ${out.settleToDeliveredMs.p99} ms (parent idle: p50 ${out.settleToDeliveredIdleParentMs.p50} ms p99 ${out.settleToDeliveredIdleParentMs.p99} ms; ${metTurn.length} met their parent in a turn: p50 ${out.settleToDeliveredMetParentTurnMs.p50} ms p99 ${out.settleToDeliveredMetParentTurnMs.p99} ms), ${out.sqlStatementsPerDelegation} statements and ${out.rowsWrittenPerDelegation} rows written per delegation, ${out.duplicateDeliveries} duplicates; CPU ms a delegation: this process ${out.clientCpuMsPerDelegation}, the server ${out.serverCpuMsPerDelegation}; a commit p50 ${floor.p50} ms, a round trip p50 ${floor.roundTripP50} ms, the CPU unit ${cpuUnit} ms`,
);
await admin.end();
await service.close();
await pool.end();
await pgServer.stop();
