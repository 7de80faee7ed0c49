// Shared bench setup: a work directory and a migrated PostgreSQL (an embedded server with durable defaults,
// reached through its Unix socket as the daemon reaches its own embedded server, or DATABASE_URL when set).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { processCpuMs } from "./machine.mjs";

/**
 * Creates a work directory named after `prefix` under the system temp directory, starts an embedded
 * PostgreSQL in it (unless DATABASE_URL is set) through @crw/db's starter and migrates it with `migrate`.
 * Returns { work, url, external, stop }; stop() stops the server and removes the work directory.
 */
export async function startBenchPostgres(prefix, migrate) {
  const work = mkdtempSync(join(tmpdir(), prefix));
  let stopServer = async () => {};
  let url = process.env.DATABASE_URL;
  const external = Boolean(url);
  if (!url) {
    const { startEmbeddedCluster } = await import("../../packages/db/dist/index.js");
    const cluster = await startEmbeddedCluster({
      dataDir: join(work, "pg"),
      persistent: false,
      postgresFlags: serverStatementFlags(),
    });
    stopServer = () => cluster.stop();
    url = cluster.localUrl();
  }
  await migrate(url);
  return {
    work,
    url,
    external,
    stop: async () => {
      await stopServer();
      rmSync(work, { recursive: true, force: true });
    },
  };
}

/**
 * Counts every statement this process sends through pg from now on: `count()` is the running total.
 * Call it before any pool or client is made.
 */
export async function countStatements() {
  const { default: pg } = await import("pg");
  let statements = 0;
  // CRW_BENCH_STATEMENTS=list: each statement's count by its text, printed to stderr at the end
  const byText = process.env.CRW_BENCH_STATEMENTS === "list" ? new Map() : null;
  const query = pg.Client.prototype.query;
  pg.Client.prototype.query = function counted(...args) {
    statements++;
    if (byText) {
      const q = args[0];
      const text = typeof q === "string" ? q : (q?.text ?? q?.name ?? "?");
      const key = String(text).replace(/\s+/g, " ").slice(0, 110);
      byText.set(key, (byText.get(key) ?? 0) + 1);
    }
    return query.apply(this, args);
  };
  return {
    count: () => statements,
    /** The statements by text, most frequent first, each with its count per `unit`. */
    report(unit) {
      if (!byText) return;
      for (const [text, n] of [...byText].sort((a, b) => b[1] - a[1]).slice(0, 40))
        process.stderr.write(`${(n / unit).toFixed(2).padStart(7)}  ${text}\n`);
    },
  };
}

/**
 * The floor a database bench compares with, measured on the same server in the same run: `n` autocommit
 * inserts into an ordinary (WAL-logged) table, one at a time, so each waits for its commit to be durable.
 * Returns { p50, p99 } of the commits and the p50 of a round trip that writes nothing (roundTripP50), in ms.
 */
export async function commitFloor(url, n = 200) {
  const { default: pg } = await import("pg");
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  const table = `bench_commit_floor_${process.pid}`;
  await client.query(`create table ${table} (x int)`);
  const ms = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await client.query(`insert into ${table} values ($1)`, [i]);
    ms.push(performance.now() - t);
  }
  // and a round trip that writes nothing: what the host charges for waking the server and back, which
  // moves from day to day with the host more than the commit's disk part does
  const trips = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await client.query("select $1::int as x", [i]);
    trips.push(performance.now() - t);
  }
  await client.query(`drop table ${table}`);
  await client.end();
  const at = (values, q) => {
    const sorted = [...values].sort((a, b) => a - b);
    return Math.round(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] * 100) / 100;
  };
  return { p50: at(ms, 0.5), p99: at(ms, 0.99), roundTripP50: at(trips, 0.5) };
}

/**
 * CRW_BENCH_SERVER_STATEMENTS=1: the embedded server loads pg_stat_statements (planning time included), so
 * a bench can print where the server's time goes (`reportServerStatements`). Off by default: it costs the
 * server a little on every statement.
 */
export function serverStatementFlags() {
  if (!process.env.CRW_BENCH_SERVER_STATEMENTS) return [];
  return ["-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.track_planning=on"];
}

/** Starts counting anew (after a bench's setup); nothing without CRW_BENCH_SERVER_STATEMENTS. */
export async function resetServerStatements(client) {
  if (!process.env.CRW_BENCH_SERVER_STATEMENTS) return;
  await client.query("create extension if not exists pg_stat_statements");
  await client.query("select pg_stat_statements_reset()");
}

/**
 * Prints to stderr the statements that took the most server time since the reset: per `unit` of work its
 * calls, then its execution and planning ms in all and ms per call.
 */
export async function reportServerStatements(client, unit) {
  if (!process.env.CRW_BENCH_SERVER_STATEMENTS) return;
  const { rows } = await client.query(
    `select calls, total_exec_time as exec, total_plan_time as plan,
            left(regexp_replace(query, '\\s+', ' ', 'g'), 100) as q
       from pg_stat_statements where query not like '%pg_stat_statements%'
      order by total_exec_time + total_plan_time desc limit 20`,
  );
  process.stderr.write("calls/unit  exec ms  plan ms  ms/call  statement\n");
  for (const r of rows) {
    const per = (Number(r.exec) + Number(r.plan)) / Math.max(1, Number(r.calls));
    const cells = [
      (Number(r.calls) / unit).toFixed(2).padStart(10),
      Number(r.exec).toFixed(0).padStart(8),
      Number(r.plan).toFixed(0).padStart(8),
      per.toFixed(3).padStart(8),
    ];
    process.stderr.write(`${cells.join(" ")}  ${r.q}\n`);
  }
}

async function serverCpuByPid(client) {
  const { rows } = await client.query("select pid from pg_stat_activity");
  const out = new Map();
  for (const { pid } of rows) {
    const ms = processCpuMs(pid);
    if (ms !== null) out.set(pid, ms);
  }
  return out;
}

/**
 * The CPU the server's processes (backends, WAL writer, checkpointer; as pg_stat_activity lists them) spend
 * over a span of a bench, whatever else runs on the machine: unlike the machine's busy time, a neighbour's
 * work is not in it. A backend that ends within the span is missed; one that starts within it counts whole.
 * `perUnit(n)` answers ms per unit; null for a server on another machine.
 */
export async function serverCpuSpan(client, external = false) {
  if (external) return { perUnit: async () => null };
  const before = await serverCpuByPid(client);
  return {
    async perUnit(units) {
      const after = await serverCpuByPid(client);
      let ms = 0;
      for (const [pid, now] of after) ms += now - (before.get(pid) ?? 0);
      return Math.round((ms / units) * 100) / 100;
    },
  };
}
