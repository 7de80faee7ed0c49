#!/usr/bin/env node
// Tap latency (built code: `npm run build` first). A daemon (in this process, its API on 127.0.0.1) on a
// real PostgreSQL (embedded with durable defaults, or DATABASE_URL) and one `session.tap` client over its
// WebSocket. Measures, per journal row, the time from its commit (the writer's COMMIT acknowledged) to the
// tap client receiving the row, p50/p99, for:
//   - in-process: the row appended by the daemon itself (its repository),
//   - another process: a forked Node process with its own connection appends it (as a runner's daemon, or
//     another daemon sharing the database, would): reached only through NOTIFY and the daemon's listener,
//   - workflow.follow: the time from a node state committing (a snapshot published by another process that
//     drives the workflow) to the follower's workflow.progress notification,
//   - with --poll-baseline also the old behaviour (wakes ignored, a 200 ms re-read timer) for comparison.
// The floor, measured in the same run on the same server: a commit carrying a NOTIFY, from COMMIT
// acknowledged to a LISTEN connection of another client receiving it (and the commit round trip itself).
// The hub's fallback bound is set to 60 s, so a lost wake shows up as an outlier, never as a timer's
// latency. Prints one JSON object, then a one-line summary.
// Usage: node bench/tap-latency.mjs [rows-per-case] [--poll-baseline]
import { fork } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { pino } from "pino";
import WebSocket from "ws";
import { startBenchPostgres } from "./lib/postgres.mjs";

const args = process.argv.slice(2);
const pollBaseline = args.includes("--poll-baseline");
const n = Number(args.find((a) => !a.startsWith("--")) ?? 200);
// CLOCK_MONOTONIC: one clock for every process of the machine (performance.timeOrigin differs per process).
const now = () => Number(process.hrtime.bigint()) / 1e6;

// ---- the writer of "another process": appends one row per request and answers with its commit time
if (process.env.CRW_BENCH_TAP_WRITER) {
  const db = await import("../packages/db/dist/index.js");
  const { PgWorkflowStore } = await import("../plugins/subagent/dist/index.js");
  const pool = new pg.Pool({ connectionString: process.env.CRW_BENCH_TAP_WRITER, max: 2 });
  const repo = new db.PgDelegationRepository(pool);
  const store = new PgWorkflowStore(pool);
  const owner = `bench-writer-${process.pid}-workflows`;
  let letGo = async () => {};
  const nodes = [];
  process.on("message", async (m) => {
    if (m === "exit") {
      await letGo();
      await pool.end();
      process.exit(0);
    }
    if (m.kind === "workflow") {
      // A workflow this process drives (a live owner lease: the daemon's takeover leaves it alone).
      letGo = await repo.holdOwnerLease(owner);
      const { id } = await store.insertWorkflow({
        id: m.workflowId,
        parentSessionId: m.sessionId,
        principalAccountId: m.accountId,
        toolCallId: "bench-follow",
        name: "bench",
        snapshot: { nodes: [] },
        owner,
      });
      process.send({ workflowId: id, generation: (await store.getWorkflow(id)).recovery.workflowGeneration });
      return;
    }
    if (m.kind === "node") {
      nodes.push({ id: m.nodeId, status: "succeeded" });
      const r = await store.publishSnapshot(m.workflowId, { nodes }, "running", m.generation, owner);
      if (r !== "updated") throw new Error(`snapshot ${r}`);
      process.send({ committedAt: now() });
      return;
    }
    const [entry] = await repo.append(m.sessionId, m.accountId, [
      { body: { type: "message", message: { role: "user", content: m.text } } },
    ]);
    process.send({ seq: entry.seq, committedAt: now() });
  });
  process.send("ready");
  await new Promise(() => {});
}

const db = await import("../packages/db/dist/index.js");
const daemonLib = await import("../apps/daemon/dist/index.js");
const pgServer = await startBenchPostgres("crw-bench-tap-", db.migrate);
const dataDir = mkdtempSync(join(tmpdir(), "crw-bench-tap-data-"));
const daemon = await daemonLib.startDaemon(
  daemonLib.loadConfig({
    env: { DATABASE_URL: pgServer.url },
    overrides: { dataDir, port: 0, runtime: { maxRunners: 1, turnsPerRunner: 2 } },
  }),
  { log: pino({ level: "silent" }) },
);
daemon.runtime.wake.fallbackMs = 60_000;

// ---- a JSON-RPC client over the daemon's WebSocket
const token = readFileSync(daemonLib.ownerTokenPath(dataDir), "utf8").trim();
const ws = new WebSocket(`${daemon.state.url.replace("http", "ws")}/rpc`, {
  headers: { authorization: `Bearer ${token}` },
});
await new Promise((ok, fail) => {
  ws.once("open", ok);
  ws.once("error", fail);
});
let nextId = 1;
const pending = new Map();
const arrivals = new Map(); // `${sessionId}:${seq}` -> received at
let arrived = () => {};
ws.on("message", (data) => {
  const at = now();
  const frame = JSON.parse(data.toString());
  if (frame.id !== undefined && pending.has(frame.id)) {
    pending.get(frame.id)(frame);
    pending.delete(frame.id);
    return;
  }
  if (frame.method === "workflow.progress") {
    const key = `${frame.params.workflowId}:${frame.params.nodeId}`;
    if (!arrivals.has(key)) arrivals.set(key, at);
    arrived();
    return;
  }
  const seq = frame.method === "session.tap" ? frame.params?.message?.seq : undefined;
  const key = `${frame.params?.sessionId}:${seq}`;
  if (typeof seq === "number" && !arrivals.has(key)) {
    arrivals.set(key, at);
    arrived();
  }
});
const call = (method, params) =>
  new Promise((resolve) => {
    const id = nextId++;
    pending.set(id, resolve);
    ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
  });
const arrivalOf = async (id, seqOrNode) => {
  const key = `${id}:${seqOrNode}`;
  while (!arrivals.has(key)) await new Promise((r) => (arrived = r));
  return arrivals.get(key);
};
const gap = () => new Promise((r) => setTimeout(r, 3 + Math.random() * 4));

const pct = (xs, q) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? Math.round(s[Math.min(s.length - 1, Math.floor(q * s.length))] * 100) / 100 : null;
};
const summary = (xs) => ({ p50: pct(xs, 0.5), p99: pct(xs, 0.99), max: pct(xs, 1), samples: xs.length });

async function tappedSession() {
  const created = await call("session.create", {});
  const sessionId = created.result.sessionId;
  const admin = new pg.Client({ connectionString: pgServer.url });
  await admin.connect();
  const r = await admin.query("select principal_account_id::text as a from sessions where id = $1::uuid", [
    sessionId,
  ]);
  await admin.end();
  const before = daemon.runtime.wake.watchCount;
  void call("session.tap", { sessionId });
  while (daemon.runtime.wake.watchCount <= before) await new Promise((r) => setTimeout(r, 2));
  await new Promise((r) => setTimeout(r, 50));
  return { sessionId, accountId: r.rows[0].a };
}

async function inProcess() {
  const { sessionId, accountId } = await tappedSession();
  const xs = [];
  for (let i = 0; i < n; i++) {
    const [entry] = await daemon.runtime.repo.append(sessionId, accountId, [
      { body: { type: "message", message: { role: "user", content: `in-process ${i}` } } },
    ]);
    const committedAt = now();
    xs.push((await arrivalOf(sessionId, entry.seq)) - committedAt);
    await gap();
  }
  return xs;
}

async function otherProcess() {
  const { sessionId, accountId } = await tappedSession();
  const w = await writer();
  const xs = [];
  for (let i = 0; i < n; i++) {
    const { seq, committedAt } = await w.ask({ sessionId, accountId, text: `elsewhere ${i}` });
    xs.push((await arrivalOf(sessionId, seq)) - committedAt);
    await gap();
  }
  w.exit();
  return xs;
}

async function writer() {
  const child = fork(new URL(import.meta.url).pathname, [], {
    env: { ...process.env, CRW_BENCH_TAP_WRITER: pgServer.url },
  });
  let answer;
  child.on("message", (m) => answer?.(m));
  await new Promise((r) => (answer = r));
  return {
    ask: (m) => {
      const reply = new Promise((r) => (answer = r));
      child.send(m);
      return reply;
    },
    exit: () => child.send("exit"),
  };
}

async function otherProcessFollow() {
  const { sessionId, accountId } = await tappedSession();
  const w = await writer();
  const { workflowId, generation } = await w.ask({
    kind: "workflow",
    workflowId: randomUUID(),
    sessionId,
    accountId,
  });
  const before = daemon.runtime.wake.watchCount;
  void call("workflow.follow", { workflowId });
  while (daemon.runtime.wake.watchCount <= before) await new Promise((r) => setTimeout(r, 2));
  await new Promise((r) => setTimeout(r, 50));
  const xs = [];
  for (let i = 0; i < n; i++) {
    const nodeId = `n${i}`;
    const { committedAt } = await w.ask({ kind: "node", workflowId, generation, nodeId });
    xs.push((await arrivalOf(workflowId, nodeId)) - committedAt);
    await gap();
  }
  w.exit();
  return xs;
}

async function floor() {
  const listener = new pg.Client({ connectionString: pgServer.url });
  const writer = new pg.Client({ connectionString: pgServer.url });
  await Promise.all([listener.connect(), writer.connect()]);
  await listener.query("listen crw_bench_floor");
  let heard = () => {};
  listener.on("notification", (m) => heard(m));
  const delivery = [];
  const commit = [];
  for (let i = 0; i < n; i++) {
    const got = new Promise((r) => (heard = r));
    await writer.query("begin");
    await writer.query("select pg_notify('crw_bench_floor', $1)", [String(i)]);
    const t0 = now();
    await writer.query("commit");
    const committedAt = now();
    await got;
    delivery.push(now() - committedAt);
    commit.push(committedAt - t0);
    await gap();
  }
  await Promise.all([listener.end(), writer.end()]);
  return { delivery, commit };
}

const f = await floor();
const inProc = await inProcess();
const other = await otherProcess();
const follow = await otherProcessFollow();
let baseline = null;
if (pollBaseline) {
  // The old loop: every wake ignored, the re-read on a 200 ms timer.
  daemon.runtime.wake.wake = () => {};
  daemon.runtime.wake.fallbackMs = 200;
  baseline = await otherProcess();
}

const out = {
  bench: "tap-latency",
  postgres: process.env.DATABASE_URL ? "external" : "embedded (durable defaults)",
  rowsPerCase: n,
  commitToTapMs: {
    inProcess: summary(inProc),
    otherProcess: summary(other),
    ...(baseline && { pollBaseline200ms: summary(baseline) }),
  },
  commitToFollowProgressMs: { otherProcess: summary(follow) },
  floor: { commitToNotifyMs: summary(f.delivery), commitMs: summary(f.commit) },
  wake: { ...daemon.runtime.wake.counts, fallbackMs: 60_000 },
};
console.log(JSON.stringify(out));
const c = out.commitToTapMs;
console.log(
  `commit -> tap: in-process p50 ${c.inProcess.p50} ms p99 ${c.inProcess.p99} ms, other process p50 ${c.otherProcess.p50} ms p99 ${c.otherProcess.p99} ms; commit -> follow progress (other process) p50 ${out.commitToFollowProgressMs.otherProcess.p50} ms p99 ${out.commitToFollowProgressMs.otherProcess.p99} ms${baseline ? `, old 200 ms poll p50 ${c.pollBaseline200ms.p50} ms p99 ${c.pollBaseline200ms.p99} ms` : ""}; floor commit -> NOTIFY received p50 ${out.floor.commitToNotifyMs.p50} ms p99 ${out.floor.commitToNotifyMs.p99} ms (commit itself p50 ${out.floor.commitMs.p50} ms)`,
);
ws.close();
await daemon.stop();
await pgServer.stop();
rmSync(dataDir, { recursive: true, force: true });
