#!/usr/bin/env node
// Live takeover benchmark (built code: `npm run build` first). Two daemons run as real processes
// (`crw daemon run`, default forked runners, default takeover sweep) on one PostgreSQL (embedded, or
// DATABASE_URL) with a model on 127.0.0.1 that speaks OpenAI Chat Completions and holds every answer. Daemon
// A gets N background delegations and a two-node workflow; once every call is open and the first node's
// turn is in flight, A is SIGKILLed and the model answers from then on. Nothing is restarted. Timed from
// the kill:
//   - the first of A's workflow nodes running on daemon B (its turn reaches the model),
//   - all N interrupted background delegations settled (and their results delivered),
//   - the workflow completed.
// The floor printed beside them: a PostgreSQL commit's latency, measured in the same run on the same server.
// Prints one JSON object, then a one-line summary. Usage: node bench/takeover.mjs [delegations]
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { join, resolve } from "node:path";
import pg from "pg";
import WebSocket from "ws";
import { startBenchPostgres } from "./lib/postgres.mjs";

const n = Number(process.argv[2] ?? 100);
const root = resolve(import.meta.dirname, "..");
const db = await import("../packages/db/dist/index.js");

// ---- the model: answers held until A is gone; when each tagged turn first reached it after the kill
let release;
const released = new Promise((r) => {
  release = r;
});
let killedAt = null;
const seen = new Set();
const firstAfterKill = new Map();
const userTexts = (body) =>
  (body.messages ?? [])
    .filter((m) => m.role === "user")
    .map((m) => (typeof m.content === "string" ? m.content : JSON.stringify(m.content)))
    .join("\n");
const sse = (text) => {
  const chunk = (delta, finish) =>
    `data: ${JSON.stringify({ id: "b", object: "chat.completion.chunk", created: 0, model: "bench", choices: [{ index: 0, delta, finish_reason: finish }], ...(finish && { usage: { prompt_tokens: 20, completion_tokens: 5, total_tokens: 25 } }) })}\n\n`;
  return `${chunk({ role: "assistant", content: text }, null)}${chunk({}, "stop")}data: [DONE]\n\n`;
};
const model = createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", async () => {
    const text = userTexts(JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}"));
    let reply = "the parent read its results";
    const tag = /\[(?:delegation result|workflow summary)/.test(text)
      ? null
      : /(CHILD-\d+|NODE-\w+)/.exec(text)?.[1];
    if (tag) {
      seen.add(tag);
      if (killedAt !== null && !firstAfterKill.has(tag)) firstAfterKill.set(tag, performance.now());
      await released;
      reply = `${tag} finished`;
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.end(sse(reply));
  });
});
await new Promise((ok) => model.listen(0, "127.0.0.1", ok));
const modelUrl = `http://127.0.0.1:${model.address().port}/v1`;

const pgSetup = await startBenchPostgres("crw-bench-takeover-", db.migrate);
const pool = new pg.Pool({ connectionString: pgSetup.url, max: 4 });
const daemons = [];

const startDaemon = async (name) => {
  const dataDir = join(pgSetup.work, name);
  const child = spawn(
    process.execPath,
    [join(root, "apps/crw/bin/crw.mjs"), "daemon", "run", "--data-dir", dataDir, "--port", "0"],
    {
      env: {
        ...process.env,
        DATABASE_URL: pgSetup.url,
        CRW_LOG_LEVEL: "warn",
        CRW_MODEL: "openai-completions:bench",
        CRW_MODEL_BASE_URL: modelUrl,
        CRW_MODEL_API_KEY_ENV: "CRW_BENCH_KEY",
        CRW_BENCH_KEY: "bench",
      },
      stdio: ["ignore", "ignore", "inherit"],
    },
  );
  const exited = new Promise((r) => child.once("exit", r));
  const d = { child, exited, dataDir };
  daemons.push(d);
  const until = Date.now() + 60_000;
  while (Date.now() < until) {
    await new Promise((r) => setTimeout(r, 50));
    try {
      const state = JSON.parse(readFileSync(join(dataDir, "daemon.state.json"), "utf8"));
      if (state.pid !== child.pid) continue;
      d.url = state.url;
      d.token = readFileSync(join(dataDir, "owner.token"), "utf8").trim();
      return d;
    } catch {}
  }
  throw new Error(`daemon ${name} did not come up`);
};

const rpc = (d) =>
  new Promise((ok, fail) => {
    const ws = new WebSocket(`${d.url.replace("http", "ws")}/rpc`, {
      headers: { authorization: `Bearer ${d.token}` },
    });
    let next = 1;
    const pending = new Map();
    ws.on("message", (data) => {
      const frame = JSON.parse(data.toString());
      const p = pending.get(frame.id);
      if (!p) return;
      pending.delete(frame.id);
      if (frame.error) p.fail(new Error(frame.error.message));
      else p.ok(frame.result);
    });
    ws.once("open", () =>
      ok({
        call: (method, params) =>
          new Promise((ok2, fail2) => {
            const id = next++;
            pending.set(id, { ok: ok2, fail: fail2 });
            ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
          }),
        close: () => ws.close(),
      }),
    );
    ws.once("error", fail);
  });

const health = async (d) =>
  (await fetch(`${d.url}/health`, { headers: { authorization: `Bearer ${d.token}` } })).json();

const waitUntil = async (check, ms) => {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 10));
  }
  return false;
};

/** Median and p99 of `count` single-row autocommit inserts: each one a commit (WAL flush) of its own. */
async function commitLatency(count = 200) {
  const c = await pool.connect();
  try {
    await c.query("create temp table bench_commit (x int)");
    const ms = [];
    for (let i = 0; i < count; i++) {
      const t = performance.now();
      await c.query("insert into bench_commit values ($1)", [i]);
      ms.push(performance.now() - t);
    }
    ms.sort((a, b) => a - b);
    return { medianMs: round(ms[Math.floor(count / 2)]), p99Ms: round(ms[Math.floor(count * 0.99)]) };
  } finally {
    c.release();
  }
}
const round = (x) => (x === undefined || x === null ? null : Math.round(x * 100) / 100);

try {
  const [a, b] = await Promise.all([startDaemon("a"), startDaemon("b")]);
  const client = await rpc(a);
  const { sessionId } = await client.call("session.create", {});
  const submitStart = performance.now();
  const { workflowId } = await client.call("workflow.start", {
    sessionId,
    format: "json",
    definition: JSON.stringify({
      name: "takeover-bench",
      nodes: [
        { id: "one", task: "NODE-one: first" },
        { id: "two", task: "NODE-two: second", dependsOn: ["one"] },
      ],
    }),
  });
  // After the workflow: its first node takes a turn slot before the children fill (and queue behind) the rest.
  for (let i = 0; i < n; i++)
    await client.call("session.delegate", { sessionId, task: `CHILD-${i}: do the work`, background: true });
  const submitMs = performance.now() - submitStart;
  client.close();
  const openRuns = async () =>
    (
      await pool.query(
        "select count(*)::int as n from subagent_runs where parent_session_id = $1::uuid and status = 'running'",
        [sessionId],
      )
    ).rows[0].n;
  const inFlight = await waitUntil(async () => seen.has("NODE-one") && (await openRuns()) === n, 60_000);
  if (!inFlight) throw new Error(`A's work never got in flight: seen ${[...seen]} open ${await openRuns()}`);
  const heldOnA = seen.size;
  const commit = await commitLatency();

  const t0 = performance.now();
  const killWall = Date.now();
  killedAt = t0;
  a.child.kill("SIGKILL");
  await a.exited;
  release();
  let allSettledMs = null;
  let workflowDoneMs = null;
  await waitUntil(async () => {
    const { rows } = await pool.query(
      `select (select count(*)::int from subagent_runs where parent_session_id = $1::uuid and status = 'succeeded') as ok,
              (select status from workflows where id = $2::uuid) as wf`,
      [sessionId, workflowId],
    );
    if (allSettledMs === null && rows[0].ok === n) allSettledMs = performance.now() - t0;
    if (workflowDoneMs === null && rows[0].wf === "completed") workflowDoneMs = performance.now() - t0;
    return allSettledMs !== null && workflowDoneMs !== null;
  }, 180_000);
  const delivered = async () =>
    (
      await pool.query(
        `select count(*)::int as acks, count(distinct a.result_id)::int as distinct_acks from delegation_result_acks a
          join delegation_results r on r.id = a.result_id where r.parent_session_id = $1::uuid`,
        [sessionId],
      )
    ).rows[0];
  let allDeliveredMs = null;
  await waitUntil(async () => {
    if ((await delivered()).acks < n + 1) return false;
    allDeliveredMs = performance.now() - t0;
    return true;
  }, 60_000);
  const { rows: dup } = await pool.query(
    `select count(*)::int as n from (select result_id from journal_entries where session_id = $1::uuid
        and result_id is not null and not discarded group by result_id having count(*) > 1) d`,
    [sessionId],
  );
  const firstNode = firstAfterKill.get("NODE-one");
  const hb = await health(b);
  const result = {
    delegations: n,
    heldOnA,
    submitMs: Math.round(submitMs),
    sweepMs: hb.takeover?.sweepMs ?? null,
    // When B's takeover pass had claimed and dispatched everything (its health's lastTakeoverAt).
    killToPassDoneMs: hb.takeover?.lastTakeoverAt ? Date.parse(hb.takeover.lastTakeoverAt) - killWall : null,
    killToFirstNodeOnBMs: firstNode === undefined ? null : Math.round(firstNode - t0),
    killToAllDelegationsSettledMs: allSettledMs === null ? null : Math.round(allSettledMs),
    killToAllDeliveredMs: allDeliveredMs === null ? null : Math.round(allDeliveredMs),
    killToWorkflowCompletedMs: workflowDoneMs === null ? null : Math.round(workflowDoneMs),
    delivered: await delivered(),
    duplicateDeliveries: dup[0].n,
    takeover: hb.takeover ?? null,
    pgCommit: commit,
    database: pgSetup.external ? "external" : "embedded",
  };
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.stdout.write(
    `takeover, peer SIGKILLed with ${n} background delegations + a workflow in flight: first node on B ${result.killToFirstNodeOnBMs} ms; all ${n} delegations settled ${result.killToAllDelegationsSettledMs} ms (delivered ${result.killToAllDeliveredMs} ms); workflow done ${result.killToWorkflowCompletedMs} ms; sweep every ${result.sweepMs} ms; PostgreSQL commit floor median ${commit.medianMs} ms (p99 ${commit.p99Ms} ms)\n`,
  );
} finally {
  for (const d of daemons) {
    if (d.child.exitCode === null && d.child.signalCode === null) {
      d.child.kill("SIGTERM");
      await d.exited;
    }
  }
  await pool.end();
  model.close();
  await pgSetup.stop();
}
