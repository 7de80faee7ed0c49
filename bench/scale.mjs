#!/usr/bin/env node
// Scale benchmark (built code: `npx nx run-many -t build` first). With the offline scripted runner at zero
// latency on a real PostgreSQL (embedded, durable defaults, unless DATABASE_URL is set), measures:
//   - a turn of a root session whose journal holds 10,000 entries against one whose journal holds 100:
//     SQL statements per turn, database time per turn (the sum of statement round trips the pg client saw
//     during the turn and the work it left) and this process's CPU time, for the first turn of the process
//     on the session (nothing folded yet) and for the turns after it; the ratio of 10,000 to 100 is the
//     figure (wanted: at most 1.5);
//   - 100 root sessions each delegating at once (background): delegations per second and the latency from
//     a result's settlement to its delivery into the parent's journal, p50/p99;
//   - a delegation of a root session that has had 10,000 results delivered against one that has had 100
//     (each seeded through the service itself: delegated, settled, delivered, answered): SQL statements and
//     database time per delegation, from the call to the parent's turn on its result (wanted: at most 1.5).
// The journals are seeded through the repository's own append (500 rows per append), so their rows are the
// rows crw writes. Prints one JSON object, then a one-line summary with a PostgreSQL commit measured in the
// same run as the floor.
// Usage: node bench/scale.mjs [turns-per-size] [parents] [delivered-results]
import pg from "pg";
import { measuredDelegationService } from "./lib/delegation.mjs";
import { commitFloor, countStatements, startBenchPostgres } from "./lib/postgres.mjs";

const turns = Number(process.argv[2] ?? 20);
const parents = Number(process.argv[3] ?? 100);
const sizes = [100, 10_000];
const history = [100, Number(process.argv[4] ?? 10_000)];
const db = await import("../packages/db/dist/index.js");
const brain = await import("../packages/brain/dist/index.js");
// As in the daemon when nobody taps these sessions: no write notifies.
db.addWakeFilter(() => false);

const pgServer = await startBenchPostgres("crw-bench-scale-", db.migrate);
const { work, url } = pgServer;
const floor = await commitFloor(url);

const counter = await countStatements();
const dbTime = timeStatements();

const { pool, service, latencies } = await measuredDelegationService({ db, brain, url, work });
const repo = service.repo;

const turnCost = {};
for (const size of sizes) turnCost[size] = await measureTurns(size);
const ratio = (k) => round(turnCost[10_000].warm[k] / turnCost[100].warm[k], 2);
const ratios = {
  statements: ratio("statements"),
  dbMs: ratio("dbMs"),
  p50DbMs: ratio("p50DbMs"),
  wanted: 1.5,
};
const delegation = await measureDelegations();
const byHistory = {};
for (const size of history) byHistory[size] = await measureHistory(size);
const [fewer, more] = history.map((h) => byHistory[h]);
const historyRatios = {
  statements: round(more.statements / fewer.statements, 2),
  dbMs: round(more.dbMs / fewer.dbMs, 2),
  p50DbMs: round(more.p50DbMs / fewer.p50DbMs, 2),
  wanted: 1.5,
};

const out = {
  bench: "scale",
  postgres: process.env.DATABASE_URL ? "external" : "embedded (durable defaults)",
  turnsPerSize: turns,
  turn: turnCost,
  ratio10000to100: ratios,
  delegation,
  delegationByHistory: byHistory,
  ratioHistory: historyRatios,
  floor: { commitMs: floor },
};
console.log(JSON.stringify(out));
console.log(
  `a turn at 10,000 entries vs 100: ${turnCost[10_000].warm.statements} vs ${turnCost[100].warm.statements} statements (x${ratios.statements}), ${turnCost[10_000].warm.dbMs} vs ${turnCost[100].warm.dbMs} db ms (x${ratios.dbMs}, p50 x${ratios.p50DbMs}; first turn ${turnCost[10_000].cold.dbMs} vs ${turnCost[100].cold.dbMs}); ${parents} roots delegating at once: ${delegation.delegationsPerSecond}/s, settle->delivered p50 ${delegation.settleToDeliveredMs.p50} ms p99 ${delegation.settleToDeliveredMs.p99} ms; a delegation after ${history[1]} results vs ${history[0]}: ${more.statements} vs ${fewer.statements} statements, ${more.dbMs} vs ${fewer.dbMs} db ms (x${historyRatios.dbMs}, p50 x${historyRatios.p50DbMs}); a commit p50 ${floor.p50} ms`,
);
await service.close();
await pool.end();
await pgServer.stop();

/** Sums the time from each statement's send to its answer, over every pg client of this process. */
function timeStatements() {
  let ms = 0;
  const query = pg.Client.prototype.query;
  pg.Client.prototype.query = function timed(...args) {
    const t = performance.now();
    const done = () => {
      ms += performance.now() - t;
    };
    const last = args.at(-1);
    if (typeof last === "function") {
      args[args.length - 1] = function answered(...r) {
        done();
        return last.apply(this, r);
      };
      return query.apply(this, args);
    }
    const result = query.apply(this, args);
    if (result && typeof result.then === "function") result.then(done, done);
    return result;
  };
  return { ms: () => ms };
}

/** A root session whose journal holds `size` entries, appended as a conversation of questions and answers. */
async function seeded(size) {
  const account = await repo.createAccount({ name: `scale-${size}` });
  const session = await service.createRootSession(account.id, "scripted");
  const filler = "x".repeat(160);
  const rows = [];
  for (let i = 0; rows.length < size; i++) {
    rows.push({ body: { type: "message", message: { role: "user", content: `question ${i} ${filler}` } } });
    if (rows.length < size)
      rows.push({
        body: {
          type: "message",
          message: {
            role: "assistant",
            content: [{ type: "text", text: `answer ${i} ${filler}` }],
            stopReason: "stop",
          },
        },
      });
  }
  for (let at = 0; at < rows.length; at += 500)
    await repo.append(session.id, account.id, rows.slice(at, at + 500));
  return { account, session };
}

/**
 * One prompt turn and the work it leaves behind (the idle parent's delivery check), so no statement of one
 * turn overlaps the next: its statements, database time and this process's CPU time.
 */
async function turn(account, session, i) {
  const statements = counter.count();
  const ms = dbTime.ms();
  const cpu = process.cpuUsage();
  await service.prompt(session.id, account.id, `turn ${i}`);
  await service.whenIdle();
  const used = process.cpuUsage(cpu);
  return {
    statements: counter.count() - statements,
    dbMs: dbTime.ms() - ms,
    cpuMs: (used.user + used.system) / 1000,
  };
}

async function measureTurns(size) {
  const { account, session } = await seeded(size);
  await service.whenIdle();
  const cold = await turn(account, session, 0);
  const warm = [];
  for (let i = 1; i <= turns; i++) warm.push(await turn(account, session, i));
  const mean = (k) => round(warm.reduce((n, t) => n + t[k], 0) / warm.length, 2);
  const p50 = (k) =>
    round(
      percentile(
        warm.map((t) => t[k]),
        0.5,
      ),
      2,
    );
  return {
    entries: size,
    cold: { statements: cold.statements, dbMs: round(cold.dbMs, 2), cpuMs: round(cold.cpuMs, 2) },
    warm: {
      statements: mean("statements"),
      dbMs: mean("dbMs"),
      p50DbMs: p50("dbMs"),
      p50CpuMs: p50("cpuMs"),
    },
  };
}

async function measureDelegations() {
  const roots = [];
  for (let p = 0; p < parents; p++) {
    const account = await repo.createAccount({ name: `scale-root-${p}` });
    roots.push({ account, parent: await service.createRootSession(account.id, "scripted") });
  }
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  const statements = counter.count();
  const started = performance.now();
  await Promise.all(
    roots.map(({ account, parent }, i) =>
      service.delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: `scale-${i}`,
        task: brain.scriptTask({ answer: `result ${i}` }),
        mode: "background",
      }),
    ),
  );
  for (;;) {
    await service.whenIdle();
    const { rows } = await admin.query(
      "select count(*)::int as n from delegation_results r join delegation_result_acks a on a.result_id = r.id",
    );
    if (rows[0].n >= parents) break;
    await new Promise((r) => setTimeout(r, 10));
  }
  const elapsedMs = performance.now() - started;
  await admin.end();
  return {
    parents,
    elapsedMs: Math.round(elapsedMs),
    delegationsPerSecond: round((parents / elapsedMs) * 1000, 1),
    settleToDeliveredMs: {
      p50: round(percentile(latencies, 0.5), 1),
      p99: round(percentile(latencies, 0.99), 1),
      samples: latencies.length,
    },
    sqlStatementsPerDelegation: round((counter.count() - statements) / parents, 1),
  };
}

function percentile(values, q) {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
}

function round(n, digits) {
  const f = 10 ** digits;
  return Math.round(n * f) / f;
}

/** One background delegation of `parent`, awaited until its result is delivered and the parent is idle. */
function delegateOnce({ account, parent }, id) {
  return service.delegate({
    parentSessionId: parent.id,
    principalAccountId: account.id,
    toolCallId: id,
    task: brain.scriptTask({ answer: `result of ${id}` }),
    mode: "background",
  });
}

/**
 * A root session that has had `size` results delivered (delegated 200 at a time, each settled, delivered
 * and answered by the parent's turn), then `turns` delegations of it one at a time: statements and database
 * time from the call to the parent's idle after its turn on the result.
 */
async function measureHistory(size) {
  const account = await repo.createAccount({ name: `scale-history-${size}` });
  const root = { account, parent: await service.createRootSession(account.id, "scripted") };
  for (let at = 0; at < size; at += 200) {
    const batch = Array.from({ length: Math.min(200, size - at) }, (_, i) =>
      delegateOnce(root, `seed-${at + i}`),
    );
    await Promise.all(batch);
    await service.whenIdle();
  }
  const each = [];
  for (let i = 0; i < turns; i++) {
    const statements = counter.count();
    const ms = dbTime.ms();
    await delegateOnce(root, `measured-${i}`);
    await service.whenIdle();
    each.push({ statements: counter.count() - statements, dbMs: dbTime.ms() - ms });
  }
  const mean = (k) => round(each.reduce((n, t) => n + t[k], 0) / each.length, 2);
  return {
    deliveredBefore: size,
    statements: mean("statements"),
    dbMs: mean("dbMs"),
    p50DbMs: round(
      percentile(
        each.map((t) => t.dbMs),
        0.5,
      ),
      2,
    ),
  };
}
