#!/usr/bin/env node
// Database lost and back (built code: `npm run build` first). One daemon (`crw daemon run`) on its own
// embedded PostgreSQL, with a model on 127.0.0.1 (OpenAI Chat Completions) that holds the answer of a
// workflow's first node. Its PostgreSQL server is SIGKILLed R times (default 3); each time the daemon
// starts the server again itself. Timed per round, from the kill:
//   - /health saying degraded,
//   - the server answering again (a new postmaster),
//   - the node's turn reaching the model again (the first continued turn of the recovered runtime),
// and, the headline, the database back → first continued turn. The floor printed beside it: a PostgreSQL
// commit's latency on the same server, measured in the same run.
// Prints one JSON object, then a one-line summary. Usage: node bench/database-loss.mjs [rounds]
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import pg from "pg";
import WebSocket from "ws";

const rounds = Number(process.argv[2] ?? 3);
const root = resolve(import.meta.dirname, "..");
const work = mkdtempSync(join(tmpdir(), "crw-bench-dbloss-"));
const dataDir = join(work, "daemon");
const pgData = join(dataDir, "postgres");

// ---- the model: the node's answer is held until the last round; each arrival is timed
const arrivals = [];
let release;
const released = new Promise((r) => {
  release = r;
});
const sse = (text) => {
  const chunk = (d, finish) =>
    `data: ${JSON.stringify({ id: "l", object: "chat.completion.chunk", created: 0, model: "dbloss", choices: [{ index: 0, delta: d, finish_reason: finish }], ...(finish && { usage: { prompt_tokens: 20, completion_tokens: 5, total_tokens: 25 } }) })}\n\n`;
  return `${chunk({ role: "assistant", content: text }, null)}${chunk({}, "stop")}data: [DONE]\n\n`;
};
const model = createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", async () => {
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
    const text = JSON.stringify(body.messages ?? []);
    const node = text.includes("NODE-one") && !text.includes("[workflow summary");
    if (node) {
      arrivals.push(performance.now());
      await released;
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.end(sse(node ? "NODE-one finished" : "noted"));
  });
});
await new Promise((ok) => model.listen(0, "127.0.0.1", ok));

const child = spawn(
  process.execPath,
  [join(root, "apps/crw/bin/crw.mjs"), "daemon", "run", "--data-dir", dataDir, "--port", "0"],
  {
    env: {
      ...Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== "DATABASE_URL")),
      CRW_LOG_LEVEL: "warn",
      CRW_MODEL: "openai-completions:dbloss",
      CRW_MODEL_BASE_URL: `http://127.0.0.1:${model.address().port}/v1`,
      CRW_MODEL_API_KEY_ENV: "CRW_DBLOSS_KEY",
      CRW_DBLOSS_KEY: "k",
    },
    stdio: ["ignore", "ignore", "inherit"],
  },
);
const exited = new Promise((r) => child.once("exit", r));
const until = (check, ms) =>
  (async () => {
    const end = Date.now() + ms;
    while (Date.now() < end) {
      if (await check()) return performance.now();
      await new Promise((r) => setTimeout(r, 5));
    }
    throw new Error("timed out");
  })();
const postmaster = () => {
  try {
    const lines = readFileSync(join(pgData, "postmaster.pid"), "utf8").split("\n");
    return { pid: Number(lines[0]), port: Number(lines[3]) };
  } catch {
    return null;
  }
};

let d;
const health = async () => {
  try {
    const r = await fetch(`${d.url}/health`, {
      headers: { authorization: `Bearer ${d.token}` },
      signal: AbortSignal.timeout(1_000),
    });
    return await r.json();
  } catch {
    return {};
  }
};
const round = (x) => Math.round(x * 10) / 10;

try {
  await until(() => existsSync(join(dataDir, "daemon.state.json")), 60_000);
  d = {
    url: JSON.parse(readFileSync(join(dataDir, "daemon.state.json"), "utf8")).url,
    token: readFileSync(join(dataDir, "owner.token"), "utf8").trim(),
  };
  const ws = new WebSocket(`${d.url.replace("http", "ws")}/rpc`, {
    headers: { authorization: `Bearer ${d.token}` },
  });
  await new Promise((ok, fail) => {
    ws.once("open", ok);
    ws.once("error", fail);
  });
  ws.send(
    JSON.stringify({
      jsonrpc: "2.0",
      id: 1,
      method: "workflow.start",
      params: {
        format: "json",
        definition: JSON.stringify({ name: "dbloss", nodes: [{ id: "one", task: "NODE-one: work" }] }),
      },
    }),
  );
  await until(() => arrivals.length === 1, 30_000);
  ws.close();

  const measured = [];
  for (let i = 0; i < rounds; i++) {
    const before = postmaster();
    const seen = arrivals.length;
    const t0 = performance.now();
    process.kill(before.pid, "SIGKILL");
    const degraded = await until(async () => (await health()).status === "degraded", 30_000);
    const back = await until(() => {
      const now = postmaster();
      return now !== null && now.pid !== before.pid;
    }, 60_000);
    const turn = await until(() => arrivals.length > seen, 60_000);
    await until(async () => (await health()).status === "ok", 30_000);
    measured.push({
      degradedMs: round(degraded - t0),
      serverBackMs: round(back - t0),
      firstTurnMs: round(turn - t0),
      backToTurnMs: round(turn - back),
    });
  }

  // the floor: a commit on the same server
  const { port } = postmaster();
  const password = readFileSync(join(dataDir, "postgres.password"), "utf8").trim();
  const pool = new pg.Pool({
    connectionString: `postgres://crw:${encodeURIComponent(password)}@127.0.0.1:${port}/crw`,
    max: 1,
  });
  pool.on("error", () => {});
  const c = await pool.connect();
  await c.query("create temp table bench_commit (x int)");
  const ms = [];
  for (let i = 0; i < 200; i++) {
    const t = performance.now();
    await c.query("insert into bench_commit values ($1)", [i]);
    ms.push(performance.now() - t);
  }
  c.release();
  await pool.end();
  ms.sort((a, b) => a - b);
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const out = {
    bench: "database-loss",
    rounds,
    perRound: measured,
    median: {
      degradedMs: median(measured.map((m) => m.degradedMs)),
      serverBackMs: median(measured.map((m) => m.serverBackMs)),
      backToTurnMs: median(measured.map((m) => m.backToTurnMs)),
    },
    floor: { commitMedianMs: round(ms[100]), commitP99Ms: round(ms[198]) },
  };
  console.log(JSON.stringify(out));
  console.log(
    `database-loss: ${rounds} SIGKILLs of the embedded PostgreSQL: degraded after ${out.median.degradedMs} ms, server back after ${out.median.serverBackMs} ms, first continued turn ${out.median.backToTurnMs} ms after the server was back (median); a commit ${out.floor.commitMedianMs} ms`,
  );
} finally {
  release();
  child.kill("SIGTERM");
  await exited;
  const left = postmaster();
  if (left) process.kill(left.pid, "SIGINT");
  model.close();
  await new Promise((r) => setTimeout(r, 500));
  rmSync(work, { recursive: true, force: true });
}
