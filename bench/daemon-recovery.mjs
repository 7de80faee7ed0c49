#!/usr/bin/env node
// Daemon boot recovery benchmark (built code: `npm run build` first). A real embedded PostgreSQL holds N
// interrupted delegated calls (status running, owned by a process that is gone, child journal empty), as a
// SIGKILLed daemon leaves them. Then the daemon is started as a real process (`crw daemon run`, default
// forked runners, scripted provider) and timed:
//   - start -> boot recovery started (process load, database, migrations),
//   - boot recovery itself (claim every run with for update skip locked, charge one attempt, dispatch),
//   - start -> first resumed turn placed (the first interrupted child running again),
//   - start -> every call settled with its result delivered (bounded).
// The floor, on the same server in the same run: a durable PostgreSQL commit. Statements: every one the daemon
// sends (boot and migrations included), per recovered call.
// Prints one JSON object, then a one-line summary. Usage: node bench/daemon-recovery.mjs [interrupted]
// (CRW_BENCH_SERVER_STATEMENTS=1: the server's time by statement, to stderr; see lib/postgres.mjs)
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import pg from "pg";
import { cpuUnitMs, machineSpan, processTreeCpuMs } from "./lib/machine.mjs";
import {
  commitFloor,
  reportServerStatements,
  resetServerStatements,
  serverCpuSpan,
  serverStatementFlags,
} from "./lib/postgres.mjs";

const n = Number(process.argv[2] ?? 1000);
const root = resolve(import.meta.dirname, "..");
const db = await import("../packages/db/dist/index.js");
const brain = await import("../packages/brain/dist/index.js");

const work = mkdtempSync(join(tmpdir(), "crw-bench-recovery-"));
const cluster = await db.startEmbeddedCluster({
  dataDir: join(work, "pg"),
  persistent: false,
  postgresFlags: serverStatementFlags(),
});
// the daemon reaches this server as it reaches its own embedded one: through the Unix socket
const url = cluster.localUrl("postgres");
let daemon;
try {
  await db.migrate(url);
  const pool = new pg.Pool({ connectionString: url, max: 8 });
  // An idle client the server ends as it stops is reported, not fatal.
  pool.on("error", (e) => console.error(`pool: ${e.message}`));
  const repo = new db.PgDelegationRepository(pool);
  const account = await repo.createAccount({ name: "bench", isOwner: true, isAdministrator: true });
  const parent = await repo.createRootSession(account.id, "scripted");
  const scope = brain.captureDelegatedExecutionScope({
    accountId: account.id,
    target: { kind: "host", ref: null },
  });
  const dead = `gone-${randomUUID()}`;
  const seedStart = performance.now();
  for (let i = 0; i < n; i++) {
    const { run } = await repo.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: `bench-${i}`,
      task: JSON.stringify({ steps: [{ text: `interrupted child ${i} finished` }] }),
      mode: "background",
      model: "scripted",
      scope,
    });
    await repo.startRun(run.id, run.generation, dead);
  }
  const seedMs = performance.now() - seedStart;

  const floor = await commitFloor(url);
  // the machine's speed at the moment (a fixed piece of JavaScript), to read another day's figures against
  const cpuUnit = cpuUnitMs();
  await resetServerStatements(pool);
  const statementsFile = join(work, "statements");
  const dataDir = join(work, "daemon");
  const t0 = performance.now();
  const machine = machineSpan();
  const server = await serverCpuSpan(pool);
  const started = Date.now();
  daemon = spawn(
    process.execPath,
    [
      // CRW_BENCH_PROFILE=<dir>: the daemon writes a CPU profile there when it exits
      ...(process.env.CRW_BENCH_PROFILE
        ? ["--cpu-prof", `--cpu-prof-dir=${process.env.CRW_BENCH_PROFILE}`]
        : []),
      join(root, "apps/crw/bin/crw.mjs"),
      ...["daemon", "run", "--data-dir", dataDir, "--port", "0"],
    ],
    {
      env: {
        ...process.env,
        DATABASE_URL: url,
        CRW_LOG_LEVEL: "warn",
        NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ""} --import ${join(import.meta.dirname, "lib/statement-count-hook.mjs")}`,
        CRW_BENCH_STATEMENTS_FILE: statementsFile,
      },
      stdio: ["ignore", "ignore", "inherit"],
    },
  );
  const stateFile = join(dataDir, "daemon.state.json");
  let base;
  let health;
  let firstTurnMs;
  let recoveryStartMs;
  let recoveryMs;
  let allSettledMs;
  /** Every process's CPU (daemon, runners, PostgreSQL) per recovered call, from the daemon's start. */
  let machineCpuMs = null;
  /** The same, of the daemon with its runners, and of PostgreSQL's processes: a neighbour's work is not in it. */
  let crwCpuMs = null;
  let serverCpuMs = null;
  const deadline = Date.now() + 180_000;
  while (Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 20));
    if (!base) {
      try {
        base = JSON.parse(readFileSync(stateFile, "utf8")).url;
      } catch {
        continue;
      }
    }
    try {
      // the whole document needs the owner's token: without one /health is liveness only
      const token = readFileSync(join(dataDir, "owner.token"), "utf8").trim();
      health = await (
        await fetch(`${base}/health`, { headers: { authorization: `Bearer ${token}` } })
      ).json();
    } catch {
      continue;
    }
    const r = health.recovery;
    if (r?.firstTurnAt && firstTurnMs === undefined) {
      firstTurnMs = Date.parse(r.firstTurnAt) - started;
      recoveryStartMs = Date.parse(r.startedAt) - started;
      recoveryMs = Date.parse(r.finishedAt) - Date.parse(r.startedAt);
    }
    if (firstTurnMs !== undefined) {
      const { rows } = await pool.query(
        "select count(*)::int as open from subagent_runs where status in ('queued','running','settling')",
      );
      if (rows[0].open === 0) {
        allSettledMs = performance.now() - t0;
        machineCpuMs = machine.perUnit(n);
        const tree = processTreeCpuMs(daemon.pid);
        crwCpuMs = tree === null ? null : Math.round((tree / n) * 100) / 100;
        serverCpuMs = await server.perUnit(n);
        break;
      }
    }
  }
  const { rows: acks } = await pool.query("select count(*)::int as n from delegation_result_acks");
  await reportServerStatements(pool, n);
  daemon.kill("SIGTERM");
  await new Promise((r) => daemon.once("exit", r));
  const statements = Number(readFileSync(statementsFile, "utf8"));
  if (process.env.CRW_BENCH_STATEMENTS === "list") {
    for (const line of readFileSync(`${statementsFile}.list`, "utf8").split("\n").slice(0, 40)) {
      const [count, text] = line.split("\t");
      process.stderr.write(`${(Number(count) / n).toFixed(2).padStart(7)}  ${text}\n`);
    }
  }
  const continued = health?.recovery?.delegations?.continued?.length ?? null;
  const result = {
    interrupted: n,
    seedMs: Math.round(seedMs),
    startToRecoveryStartMs: recoveryStartMs ?? null,
    bootRecoveryMs: recoveryMs ?? null,
    startToFirstResumedTurnMs: firstTurnMs ?? null,
    startToAllSettledMs: allSettledMs === undefined ? null : Math.round(allSettledMs),
    continued,
    deliveredSoFar: acks[0].n,
    placements: health?.placements ?? null,
    runners: health?.pool?.runners?.length ?? null,
    statementsPerRecoveredCall: Math.round((statements / n) * 10) / 10,
    machineCpuMsPerRecoveredCall: machineCpuMs,
    daemonAndRunnersCpuMsPerRecoveredCall: crwCpuMs,
    serverCpuMsPerRecoveredCall: serverCpuMs,
    commitFloorMs: floor,
    cpuUnitMs: cpuUnit,
  };
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.stdout.write(
    `daemon recovery, ${n} interrupted delegations: first resumed turn ${firstTurnMs} ms after start (boot recovery ${recoveryMs} ms, starting at ${recoveryStartMs} ms); all settled at ${result.startToAllSettledMs} ms; ${result.statementsPerRecoveredCall} statements per call; CPU ms a call: daemon and runners ${crwCpuMs}, the server ${serverCpuMs}; commit floor p50 ${floor.p50} ms, a round trip p50 ${floor.roundTripP50} ms; the CPU unit ${cpuUnit} ms\n`,
  );
  await pool.end();
} finally {
  if (daemon && daemon.exitCode === null) {
    daemon.kill("SIGTERM");
    await new Promise((r) => daemon.once("exit", r));
  }
  await cluster.stop();
  rmSync(work, { recursive: true, force: true });
}
