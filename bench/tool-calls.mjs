#!/usr/bin/env node
// Cost of one coding-tool call (read, write, edit, shell), each figure beside its floor measured in the
// same run (built code: `npm run build` first; this bench does not build). Two parts:
//
// 1. In process, the tool objects of createChildTools called directly (`execute`), interleaved with:
//    - shell `true` (always in bubblewrap) vs spawning /bin/true (until exit), a bare
//      `bwrap --ro-bind / / true`, and bwrap with crw's own sandbox argv (captured from the tool's first
//      spawn, replayed with the same stdio): tool minus that last floor is crw's own JavaScript, that floor
//      minus bare bwrap is what the sandbox's namespaces and mounts cost;
//    - read of a 4 KiB file vs fs.promises.readFile;
//    - write of 4 KiB vs open + writeFile + fsync + close; edit vs readFile + the same durable write.
// 2. In agent turns, through the built daemon started in this process (a real PostgreSQL: embedded with
//    durable defaults, or DATABASE_URL; its real WebSocket JSON-RPC) and the offline `scripted` provider:
//    `session.delegate` from a fresh root session (created with `cwd`) of a child whose task is a script
//    of N steps of one tool call each, then an answer. Two daemons run side by side, each on its own
//    database of that server: one with runners (the default: the child's turn runs in a forked runner),
//    one with runners off (the same turn runs in the daemon's process), so only the placement differs.
//    Per call = (turn with N calls - p50 of a turn with 0 calls, same placement) / N, one sample per turn;
//    and the cycle, the interval between two consecutive tool calls' progress events inside a turn (N - 1
//    samples per turn). Turns alternate kinds and placements. Each tool result is checked in the journal
//    (session.read) to have succeeded and each turn's placement is checked (observeTurn); SQL statements
//    sent by this process are counted per call. The journal's floors: a PostgreSQL round trip (`select 1`)
//    and one that commits (an xid is assigned, so the commit flushes WAL).
// Prints one JSON object (all times in ms), then a one-line summary.
// Usage: node bench/tool-calls.mjs [shell-iterations] [calls-per-turn] [turns-per-kind]
import cp, { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { open, readFile } from "node:fs/promises";
import { syncBuiltinESMExports } from "node:module";
import os, { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import pg from "pg";
import WebSocket from "ws";
import { startBenchPostgres } from "./lib/postgres.mjs";

const shellIterations = Number(process.argv[2] ?? 200);
const callsPerTurn = Number(process.argv[3] ?? 16);
const turnsPerKind = Number(process.argv[4] ?? 10);
// A turn makes at most 100 provider requests (runChildTurn's default bound): N tool steps and the answer.
if (!(callsPerTurn >= 1 && callsPerTurn <= 99)) throw new Error("calls-per-turn must be 1..99");
const readIterations = shellIterations * 10;
const writeIterations = shellIterations;
const WARMUP = 10;

const brain = await import("../packages/brain/dist/index.js");
const db = await import("../packages/db/dist/index.js");
const daemonPkg = await import("../apps/daemon/dist/index.js");

const round = (x) => Math.round(x * 1000) / 1000;
const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
const stats = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return { n: 0 };
  return { n: s.length, minMs: round(s[0]), p50Ms: round(pct(s, 0.5)), p99Ms: round(pct(s, 0.99)) };
};
const median = (xs) =>
  pct(
    [...xs].sort((a, b) => a - b),
    0.5,
  );
const timed = async (fn) => {
  const t = performance.now();
  await fn();
  return performance.now() - t;
};
const waitExit = (child) =>
  new Promise((resolve, reject) => {
    child.once("error", reject);
    child.once("exit", (code) => (code === 0 ? resolve() : reject(new Error(`exit code ${code}`))));
  });

const root = realpathSync(mkdtempSync(join(tmpdir(), "crw-bench-tools-")));
/** The type of the filesystem holding `path` (the longest mount point above it), for the fsync figures. */
function filesystemOf(path) {
  try {
    let best = { at: "", type: null };
    for (const line of readFileSync("/proc/mounts", "utf8").split("\n")) {
      const [, at, type] = line.split(" ");
      if (at && (path === at || path.startsWith(at === "/" ? "/" : `${at}/`)) && at.length >= best.at.length)
        best = { at, type };
    }
    return best.type;
  } catch {
    return null;
  }
}
const KIB4 = `${"x".repeat(4095)}\n`;

// ---- 1. in process, the tools called directly ----
mkdirSync(join(root, "direct"));
const wd = realpathSync(join(root, "direct"));
const scope = brain.parseDelegatedExecutionScope(
  brain.captureDelegatedExecutionScope({
    accountId: "bench",
    target: { kind: "host", ref: null },
    workDir: wd,
  }),
);
const tools = Object.fromEntries(brain.createChildTools({ workDir: wd, scope }).map((t) => [t.name, t]));
const signal = new AbortController().signal;
let callNo = 0;
const run = (name, params) => tools[name].execute(`call-${callNo++}`, params, signal);

// crw's exact sandbox invocation and the time the tool takes to reach its spawn: child_process.spawn is
// wrapped during the shell loop (ESM bindings of the builtin follow syncBuiltinESMExports), then put back.
const realSpawn = cp.spawn;
let captured;
let spawnedAt = 0;
cp.spawn = function observed(...spawnArgs) {
  spawnedAt = performance.now();
  const [file, args, options] = spawnArgs;
  captured ??= { file, args: [...args], options: { ...options } };
  return realSpawn.apply(this, spawnArgs);
};
syncBuiltinESMExports();
await run("shell", { command: "true" });
if (!captured) throw new Error("the shell tool spawned nothing");

const spawnTrue = () => waitExit(spawn("/bin/true", [], { stdio: "ignore" }));
const bareBwrap = () => waitExit(spawn(captured.file, ["--ro-bind", "/", "/", "true"], { stdio: "ignore" }));
// Replayed as the tool runs it: same argv, env, cwd, detached, pipes drained, until close.
const crwArgv = () =>
  new Promise((resolve, reject) => {
    const child = spawn(captured.file, captured.args, captured.options);
    for (const s of child.stdio) s?.resume();
    child.once("error", reject);
    child.once("close", (code) => (code === 0 ? resolve() : reject(new Error(`exit code ${code}`))));
  });
const shellSamples = { tool: [], toolUntilSpawn: [], spawnTrue: [], bareBwrap: [], crwSandboxArgv: [] };
for (let i = 0; i < shellIterations + WARMUP; i++) {
  // Interleaved so machine load affects all alike.
  const row = [
    ["spawnTrue", await timed(spawnTrue)],
    ["bareBwrap", await timed(bareBwrap)],
    ["crwSandboxArgv", await timed(crwArgv)],
  ];
  const t0 = performance.now();
  await run("shell", { command: "true" });
  row.push(["tool", performance.now() - t0], ["toolUntilSpawn", spawnedAt - t0]);
  if (i >= WARMUP) for (const [k, v] of row) shellSamples[k].push(v);
}
cp.spawn = realSpawn;
syncBuiltinESMExports();
const rssAtDirect = process.memoryUsage().rss;

writeFileSync(join(wd, "r.txt"), KIB4);
const readSamples = { tool: [], readFile: [] };
for (let i = 0; i < readIterations + WARMUP; i++) {
  const a = await timed(() => run("read", { path: "r.txt" }));
  const b = await timed(() => readFile(join(wd, "r.txt"), "utf8"));
  if (i >= WARMUP) {
    readSamples.tool.push(a);
    readSamples.readFile.push(b);
  }
}

const durableWrite = async (path, content) => {
  const h = await open(path, "w");
  try {
    await h.writeFile(content, "utf8");
    await h.sync();
  } finally {
    await h.close();
  }
};
const marked = (m) => `<${m}>${KIB4.slice(6)}`;
writeFileSync(join(wd, "e-tool.txt"), marked("AAAA"));
writeFileSync(join(wd, "e-floor.txt"), marked("AAAA"));
const writeSamples = { tool: [], floor: [] };
const editSamples = { tool: [], floor: [] };
for (let i = 0; i < writeIterations + WARMUP; i++) {
  const [from, to] = i % 2 === 0 ? ["<AAAA>", "<BBBB>"] : ["<BBBB>", "<AAAA>"];
  const row = [
    [writeSamples.tool, await timed(() => run("write", { path: "w-tool.txt", content: KIB4 }))],
    [writeSamples.floor, await timed(() => durableWrite(join(wd, "w-floor.txt"), KIB4))],
    [editSamples.tool, await timed(() => run("edit", { path: "e-tool.txt", oldText: from, newText: to }))],
    [
      editSamples.floor,
      await timed(async () => {
        const path = join(wd, "e-floor.txt");
        const before = await readFile(path, "utf8");
        const at = before.indexOf(from);
        if (at < 0) throw new Error("edit floor: marker not found");
        await durableWrite(path, before.slice(0, at) + to + before.slice(at + from.length));
      }),
    ],
  ];
  if (i >= WARMUP) for (const [list, v] of row) list.push(v);
}

const direct = {
  shell: {
    iterations: shellIterations,
    command: "true",
    tool: stats(shellSamples.tool),
    floorSpawnTrue: stats(shellSamples.spawnTrue),
    floorBareBwrap: stats(shellSamples.bareBwrap),
    floorCrwSandboxArgv: stats(shellSamples.crwSandboxArgv),
    crwSandboxArgc: captured.args.length,
    toolUntilSpawn: stats(shellSamples.toolUntilSpawn),
  },
  read: {
    iterations: readIterations,
    bytes: 4096,
    tool: stats(readSamples.tool),
    floorReadFile: stats(readSamples.readFile),
  },
  write: {
    iterations: writeIterations,
    bytes: 4096,
    tool: stats(writeSamples.tool),
    floorOpenWriteFsyncClose: stats(writeSamples.floor),
  },
  edit: {
    iterations: writeIterations,
    bytes: 4096,
    tool: stats(editSamples.tool),
    floorReadWriteFsync: stats(editSamples.floor),
  },
};
const p50 = (s) => s.p50Ms;
direct.shell.p50Split = {
  crwJsOverSandboxArgv: round(p50(direct.shell.tool) - p50(direct.shell.floorCrwSandboxArgv)),
  sandboxPolicyOverBareBwrap: round(p50(direct.shell.floorCrwSandboxArgv) - p50(direct.shell.floorBareBwrap)),
  bareBwrapOverSpawn: round(p50(direct.shell.floorBareBwrap) - p50(direct.shell.floorSpawnTrue)),
};

// ---- 2. in agent turns: a runner vs the daemon's process ----
// Two daemons in this process, each on its own database of one PostgreSQL: one with runners (the default:
// a delegated child's turn runs in a forked runner), one with runners turned off (the same child turn runs
// in the daemon's process). Both take the same session.delegate, so only the placement differs.
const pgServer = await startBenchPostgres("crw-bench-tools-pg-", db.migrate);
const secondUrl = new URL(pgServer.url);
{
  const admin = new pg.Client({ connectionString: pgServer.url });
  await admin.connect();
  await admin.query("drop database if exists crw_bench_tool_calls_b");
  await admin.query("create database crw_bench_tool_calls_b");
  await admin.end();
  secondUrl.pathname = "/crw_bench_tool_calls_b";
  await db.migrate(secondUrl.href);
}
let statements = 0;
const query = pg.Client.prototype.query;
pg.Client.prototype.query = function counted(...args) {
  statements++;
  return query.apply(this, args);
};

async function startBenchDaemon(name, url, runners) {
  const placementOf = new Map();
  const dataDir = join(pgServer.work, `daemon-${name}`);
  const daemon = await daemonPkg.startDaemon(
    daemonPkg.loadConfig({
      env: { DATABASE_URL: url },
      overrides: { dataDir, port: 0, logLevel: "silent", runtime: { subagentRunnerEnabled: runners } },
    }),
    { observeTurn: (request, placement) => placementOf.set(request.sessionId, placement) },
  );
  // The consecutive tool calls of a turn, as the daemon publishes them (a runner's reach it over IPC).
  const toolEvents = new Map();
  const bus = daemon.runtime.bus;
  const publish = bus.publish.bind(bus);
  bus.publish = (topic, event) => {
    if (event?.type === "progress" && event.event?.type === "tool") {
      const at = performance.now();
      const list = toolEvents.get(event.event.sessionId);
      if (list) list.push(at);
      else toolEvents.set(event.event.sessionId, [at]);
    }
    return publish(topic, event);
  };
  // A JSON-RPC client over the daemon's WebSocket (as the daemon's tests' TestClient).
  const token = readFileSync(daemonPkg.ownerTokenPath(dataDir), "utf8").trim();
  const ws = new WebSocket(`${daemon.state.url.replace("http", "ws")}/rpc`, {
    headers: { authorization: `Bearer ${token}` },
  });
  await new Promise((resolve, reject) => {
    ws.once("open", resolve);
    ws.once("error", reject);
  });
  let rpcId = 1;
  const pending = new Map();
  ws.on("message", (data) => {
    const frame = JSON.parse(data.toString());
    const answer = pending.get(frame.id);
    if (!answer) return;
    pending.delete(frame.id);
    if (frame.error) answer.reject(new Error(`${frame.error.message} (${frame.error.data?.code})`));
    else answer.resolve(frame.result);
  });
  const rpc = (method, params) =>
    new Promise((resolve, reject) => {
      const id = rpcId++;
      pending.set(id, { resolve, reject });
      ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  const dir = realpathSync(mkdtempSync(join(root, `${name}-`)));
  writeFileSync(join(dir, "r.txt"), KIB4);
  return {
    daemon,
    rpc,
    placementOf,
    toolEvents,
    dir,
    expect: runners ? "runner" : "in-process",
    close: async () => {
      ws.close();
      await daemon.stop();
    },
  };
}
const placements = {};
let inTurns;
try {
  placements.runner = await startBenchDaemon("runner", pgServer.url, true);
  placements.daemon = await startBenchDaemon("in-process", secondUrl.href, false);

  // PostgreSQL floors for the journal, on the same server.
  const pgFloor = { roundTrip: [], commit: [] };
  let pgSettings;
  {
    const client = new pg.Client({ connectionString: pgServer.url });
    await client.connect();
    const { rows } = await query.call(
      client,
      "select name, setting from pg_settings where name in ('fsync', 'synchronous_commit', 'wal_sync_method', 'server_version')",
    );
    pgSettings = Object.fromEntries(rows.map((r) => [r.name, r.setting]));
    for (let i = 0; i < 200 + WARMUP; i++) {
      const a = await timed(() => query.call(client, "select 1"));
      const b = await timed(() => query.call(client, "select txid_current()"));
      if (i >= WARMUP) {
        pgFloor.roundTrip.push(a);
        pgFloor.commit.push(b);
      }
    }
    await client.end();
  }

  const editMark = (i) => `<${String(i).padStart(4, "0")}>`;
  const KINDS = {
    zero: { calls: 0, call: () => null },
    shell: { calls: callsPerTurn, call: () => ({ name: "shell", arguments: { command: "true" } }) },
    read: { calls: callsPerTurn, call: () => ({ name: "read", arguments: { path: "r.txt" } }) },
    write: {
      calls: callsPerTurn,
      call: () => ({ name: "write", arguments: { path: "w.txt", content: KIB4 } }),
    },
    edit: {
      calls: callsPerTurn,
      prepare: (dir) => writeFileSync(join(dir, "e.txt"), `${editMark(0)}${KIB4.slice(6)}`),
      call: (i) => ({
        name: "edit",
        arguments: { path: "e.txt", oldText: editMark(i), newText: editMark(i + 1) },
      }),
    },
  };
  const script = (kind) =>
    JSON.stringify({
      steps: [
        ...Array.from({ length: kind.calls }, (_, i) => ({ toolCalls: [kind.call(i)] })),
        { text: "done" },
      ],
    });

  /** Checks a finished turn: its placement, every tool result a success, one progress event per call. */
  async function checkTurn(place, sessionId, kindName, calls, expect) {
    if (place.placementOf.get(sessionId) !== expect)
      throw new Error(`${kindName}: the turn ran ${place.placementOf.get(sessionId)}, not ${expect}`);
    const { messages } = await place.rpc("session.read", { sessionId, limit: 1000 });
    const results = messages.filter((m) => m.role === "toolResult");
    const failed = results.filter((m) => m.isError);
    if (results.length !== calls || failed.length > 0)
      throw new Error(`${kindName}: ${results.length} results of ${calls}, failed: ${failed[0]?.text}`);
    const at = place.toolEvents.get(sessionId) ?? [];
    place.toolEvents.delete(sessionId);
    if (at.length !== calls) throw new Error(`${kindName}: ${at.length} tool events for ${calls} calls`);
    return at.slice(1).map((t, i) => t - at[i]);
  }

  /** One timed delegated turn of `kindName` at `placementName`: its wall time, cycles and SQL statements. */
  async function turn(placementName, kindName) {
    const place = placements[placementName];
    const kind = KINDS[kindName];
    const { sessionId } = await place.rpc("session.create", { cwd: place.dir });
    kind.prepare?.(place.dir);
    const task = script(kind);
    const before = statements;
    const t0 = performance.now();
    const receipt = await place.rpc("session.delegate", { sessionId, task, model: "scripted" });
    const ms = performance.now() - t0;
    const sql = statements - before;
    if (receipt.kind !== "result" || receipt.outcome !== "ok" || receipt.body !== "done")
      throw new Error(`the delegated turn did not answer: ${JSON.stringify(receipt)}`);
    const cycles = await checkTurn(place, receipt.childSessionId, kindName, kind.calls, place.expect);
    return { ms, sql, cycles };
  }

  // Where a root session created with a working directory runs its turn (one untimed shell call).
  async function rootTurnPlacement(place) {
    const { sessionId } = await place.rpc("session.create", { cwd: place.dir });
    const reply = await place.rpc("session.send", { sessionId, text: script({ ...KINDS.shell, calls: 1 }) });
    if (reply.reply !== "done") throw new Error(`the root turn did not answer: ${JSON.stringify(reply)}`);
    return place.placementOf.get(sessionId);
  }

  const kindNames = Object.keys(KINDS);
  const placeNames = Object.keys(placements);
  // Warm-up: the first delegation forks the runner; pi and every tool path load once per process.
  for (const k of kindNames) for (const p of placeNames) await turn(p, k);
  const rootWithCwd = {
    runnersOn: await rootTurnPlacement(placements.runner),
    runnersOff: await rootTurnPlacement(placements.daemon),
  };
  const runnerIds = () => placements.runner.daemon.runtime.health().pool.runners.map((r) => r.runnerId);
  const runnersBefore = runnerIds();
  const turnSamples = Object.fromEntries(
    placeNames.map((p) => [p, Object.fromEntries(kindNames.map((k) => [k, []]))]),
  );
  const turnPhaseStart = performance.now();
  for (let r = 0; r < turnsPerKind; r++) {
    // Interleaved: kinds and placements alternate, so drifting load affects all alike.
    for (const k of kindNames) for (const p of placeNames) turnSamples[p][k].push(await turn(p, k));
  }
  const turnPhaseMs = performance.now() - turnPhaseStart;
  const runnersAfter = runnerIds();

  // The direct shell figures again, now that this process also holds two daemons (a larger heap, more
  // handles, their timers): tells whether the tool itself gets slower in a loaded daemon process.
  const rssBeforeDaemonsMb = Math.round(rssAtDirect / 2 ** 20);
  const late = { tool: [], spawnTrue: [] };
  for (let i = 0; i < Math.ceil(shellIterations / 4) + WARMUP; i++) {
    const a = await timed(spawnTrue);
    const b = await timed(() => run("shell", { command: "true" }));
    if (i >= WARMUP) {
      late.spawnTrue.push(a);
      late.tool.push(b);
    }
  }
  direct.shell.withDaemonsResident = {
    rssMb: { duringDirect: rssBeforeDaemonsMb, withDaemons: Math.round(process.memoryUsage().rss / 2 ** 20) },
    tool: stats(late.tool),
    floorSpawnTrue: stats(late.spawnTrue),
  };

  inTurns = {
    callsPerTurn,
    turnsPerKind,
    note: "perCall has one sample per turn (its p99 is the worst turn); cycle has N - 1 per turn",
    placement: {},
  };
  for (const p of placeNames) {
    const zero = turnSamples[p].zero;
    const zeroP50 = median(zero.map((s) => s.ms));
    const zeroSql = median(zero.map((s) => s.sql));
    const out = { zeroCallTurn: { ...stats(zero.map((s) => s.ms)), sqlStatements: zeroSql } };
    for (const k of kindNames.filter((k) => k !== "zero")) {
      const samples = turnSamples[p][k];
      out[k] = {
        turn: stats(samples.map((s) => s.ms)),
        perCall: stats(samples.map((s) => (s.ms - zeroP50) / callsPerTurn)),
        cycle: stats(samples.flatMap((s) => s.cycles)),
        sqlStatementsPerCall: round((median(samples.map((s) => s.sql)) - zeroSql) / callsPerTurn),
      };
    }
    inTurns.placement[p] = out;
  }
  inTurns.placement.runner.where = "delegated child in a forked runner (daemon with runners, the default)";
  inTurns.placement.daemon.where = "delegated child in the daemon's process (daemon with runners off)";
  inTurns.rootSessionWithCwdRunsIn = rootWithCwd;
  inTurns.runnerForkedDuringMeasurement = runnersAfter.some((id) => !runnersBefore.includes(id));
  inTurns.phaseWallMs = Math.round(turnPhaseMs);
  inTurns.floorPg = {
    ...pgSettings,
    roundTripSelect1: stats(pgFloor.roundTrip),
    commitWithXid: stats(pgFloor.commit),
  };
  // What a call costs on top of the tool itself (p50s): the agent loop and its journal in the daemon's
  // process, and what the runner boundary adds to that.
  const directTool = {
    shell: direct.shell.tool,
    read: direct.read.tool,
    write: direct.write.tool,
    edit: direct.edit.tool,
  };
  inTurns.p50OverheadPerCallMs = Object.fromEntries(
    Object.entries(directTool).map(([k, tool]) => [
      k,
      {
        inProcessTurnOverDirectTool: round(p50(inTurns.placement.daemon[k].perCall) - p50(tool)),
        runnerOverInProcessTurn: round(
          p50(inTurns.placement.runner[k].perCall) - p50(inTurns.placement.daemon[k].perCall),
        ),
      },
    ]),
  );
} finally {
  for (const p of Object.values(placements)) await p.close();
  pg.Client.prototype.query = query;
  if (pgServer.external) {
    const admin = new pg.Client({ connectionString: pgServer.url });
    await admin.connect();
    await admin.query("drop database if exists crw_bench_tool_calls_b");
    await admin.end();
  }
  await pgServer.stop();
  rmSync(root, { recursive: true, force: true });
}

const bwrapVersion = (() => {
  try {
    return cp.execFileSync(captured.file, ["--version"], { encoding: "utf8" }).trim();
  } catch {
    return null;
  }
})();
const result = {
  bench: "tool-calls",
  node: process.version,
  cpus: os.availableParallelism(),
  cpuModel: os.cpus()[0]?.model ?? null,
  kernel: os.release(),
  loadAverage1m: round(os.loadavg()[0]),
  bwrap: bwrapVersion ?? captured.file,
  tmpFilesystem: filesystemOf(root),
  database: pgServer.external ? "DATABASE_URL" : "embedded",
  direct,
  inTurns,
  wallMs: Math.round(performance.now()),
};
process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);

const f = (x) => (x >= 10 ? x.toFixed(1) : x >= 1 ? x.toFixed(2) : x.toFixed(3));
const R = inTurns.placement.runner;
const D = inTurns.placement.daemon;
const turnPart = (k) =>
  `per call in a turn: runner p50 ${f(p50(R[k].perCall))} ms, in-process p50 ${f(p50(D[k].perCall))} ms`;
process.stdout.write(
  `tool-calls: shell in-process p50 ${f(p50(direct.shell.tool))} ms (floor spawn true ${f(p50(direct.shell.floorSpawnTrue))} ms, bare bwrap ${f(p50(direct.shell.floorBareBwrap))} ms, crw's bwrap argv ${f(p50(direct.shell.floorCrwSandboxArgv))} ms); ${turnPart("shell")}; ` +
    `read ${f(p50(direct.read.tool))} ms (readFile ${f(p50(direct.read.floorReadFile))} ms); ${turnPart("read")}; ` +
    `write ${f(p50(direct.write.tool))} ms (open+write+fsync+close ${f(p50(direct.write.floorOpenWriteFsyncClose))} ms); ${turnPart("write")}; ` +
    `edit ${f(p50(direct.edit.tool))} ms (read+write+fsync ${f(p50(direct.edit.floorReadWriteFsync))} ms); ${turnPart("edit")}; ` +
    `0-call turn runner ${f(p50(R.zeroCallTurn))} / in-process ${f(p50(D.zeroCallTurn))} ms; PG round trip ${f(p50(inTurns.floorPg.roundTripSelect1))} ms (with a commit ${f(p50(inTurns.floorPg.commitWithXid))} ms); ` +
    `${callsPerTurn} calls x ${turnsPerKind} turns, ${result.cpus} cpus, load ${result.loadAverage1m}\n`,
);
