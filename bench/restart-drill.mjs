#!/usr/bin/env node
// Restart drill (built code: `npm run build` first). One daemon (`crw daemon run`, default forked runners)
// on PostgreSQL (embedded, or DATABASE_URL) with a model on 127.0.0.1 that speaks OpenAI Chat Completions
// and takes ~700 ms per answer; N background delegations (default 20) each take four model rounds with a
// quick `read` between them. While they work, the daemon is SIGKILLed K times (default 5), 1.6 s after
// each start, and started again each time at once (five kills take about 12 s). Then: how many calls
// succeeded, how many ended with a recovery_failed error, the recovery attempts charged and the free
// continuations taken, and how long after the last start everything settled. The floor printed beside
// the settle time: one model answer.
// Prints one JSON object, then a one-line summary. Usage: node bench/restart-drill.mjs [delegations] [kills]
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { join, resolve } from "node:path";
import pg from "pg";
import WebSocket from "ws";
import { startBenchPostgres } from "./lib/postgres.mjs";

const n = Number(process.argv[2] ?? 20);
const kills = Number(process.argv[3] ?? 5);
const ANSWER_MS = 700;
const root = resolve(import.meta.dirname, "..");
const db = await import("../packages/db/dist/index.js");

// ---- the model: each child reads three times, then answers; every answer takes ANSWER_MS
const sse = (delta) => {
  const chunk = (d, finish) =>
    `data: ${JSON.stringify({ id: "d", object: "chat.completion.chunk", created: 0, model: "drill", choices: [{ index: 0, delta: d, finish_reason: finish }], ...(finish && { usage: { prompt_tokens: 20, completion_tokens: 5, total_tokens: 25 } }) })}\n\n`;
  return `${chunk(delta, null)}${chunk({}, delta.tool_calls ? "tool_calls" : "stop")}data: [DONE]\n\n`;
};
let calls = 0;
const model = createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", async () => {
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
    const messages = body.messages ?? [];
    const text = messages
      .filter((m) => m.role === "user")
      .map((m) => (typeof m.content === "string" ? m.content : JSON.stringify(m.content)))
      .join("\n");
    const child = /CHILD-\d+/.test(text) && !/\[delegation result/.test(text);
    const reads = messages.filter((m) => m.role === "tool").length;
    const offersRead = (body.tools ?? []).some((t) => t.function?.name === "read");
    calls++;
    await new Promise((r) => setTimeout(r, child ? ANSWER_MS : 5));
    res.writeHead(200, { "content-type": "text/event-stream" });
    if (child && reads < 3 && offersRead)
      res.end(
        sse({
          role: "assistant",
          tool_calls: [
            {
              index: 0,
              id: `r${reads}`,
              type: "function",
              function: { name: "read", arguments: JSON.stringify({ path: "README.md" }) },
            },
          ],
        }),
      );
    else res.end(sse({ role: "assistant", content: child ? "the work is done" : "noted" }));
  });
});
await new Promise((ok) => model.listen(0, "127.0.0.1", ok));
const modelUrl = `http://127.0.0.1:${model.address().port}/v1`;

const pgSetup = await startBenchPostgres("crw-bench-drill-", db.migrate);
const pool = new pg.Pool({ connectionString: pgSetup.url, max: 4 });
// the server stops at the end while idle clients may still be open
pool.on("error", () => {});
const dataDir = join(pgSetup.work, "daemon");
let daemon;

const startDaemon = async () => {
  const child = spawn(
    process.execPath,
    [join(root, "apps/crw/bin/crw.mjs"), "daemon", "run", "--data-dir", dataDir, "--port", "0"],
    {
      cwd: root,
      env: {
        ...process.env,
        DATABASE_URL: pgSetup.url,
        CRW_LOG_LEVEL: "warn",
        CRW_MODEL: "openai-completions:drill",
        CRW_MODEL_BASE_URL: modelUrl,
        CRW_MODEL_API_KEY_ENV: "CRW_DRILL_KEY",
        CRW_DRILL_KEY: "drill",
      },
      stdio: ["ignore", "ignore", "inherit"],
    },
  );
  const exited = new Promise((r) => child.once("exit", r));
  const until = Date.now() + 60_000;
  while (Date.now() < until) {
    await new Promise((r) => setTimeout(r, 25));
    try {
      const state = JSON.parse(readFileSync(join(dataDir, "daemon.state.json"), "utf8"));
      if (state.pid !== child.pid) continue;
      const token = readFileSync(join(dataDir, "owner.token"), "utf8").trim();
      return { child, exited, url: state.url, token };
    } catch {}
  }
  throw new Error("the daemon did not come up");
};

const call = (d, method, params) =>
  new Promise((ok, fail) => {
    const ws = new WebSocket(`${d.url.replace("http", "ws")}/rpc`, {
      headers: { authorization: `Bearer ${d.token}` },
    });
    ws.once("open", () => ws.send(JSON.stringify({ jsonrpc: "2.0", id: 1, method, params })));
    ws.once("message", (data) => {
      const frame = JSON.parse(data.toString());
      ws.close();
      if (frame.error) fail(new Error(frame.error.message));
      else ok(frame.result);
    });
    ws.once("error", fail);
  });

const runs = async (sessionId) =>
  (
    await pool.query(
      `select status, error->>'code' as code, recovery_attempts, free_continuations
         from subagent_runs where parent_session_id = $1::uuid`,
      [sessionId],
    )
  ).rows;

try {
  daemon = await startDaemon();
  const { sessionId } = await call(daemon, "session.create", { cwd: root });
  for (let i = 0; i < n; i++)
    await call(daemon, "session.delegate", {
      sessionId,
      task: `CHILD-${i}: read and report`,
      background: true,
    });
  const drillStart = performance.now();
  for (let k = 0; k < kills; k++) {
    await new Promise((r) => setTimeout(r, 1_600));
    daemon.child.kill("SIGKILL");
    await daemon.exited;
    daemon = await startDaemon();
  }
  const drillMs = performance.now() - drillStart;
  const lastStart = performance.now();
  const until = Date.now() + 300_000;
  let rows = await runs(sessionId);
  while (rows.some((r) => ["queued", "running", "settling"].includes(r.status)) && Date.now() < until) {
    await new Promise((r) => setTimeout(r, 100));
    rows = await runs(sessionId);
  }
  const settleMs = performance.now() - lastStart;
  const sum = (f) => rows.reduce((a, r) => a + Number(r[f] ?? 0), 0);
  const out = {
    bench: "restart-drill",
    delegations: n,
    kills,
    drillSeconds: Math.round(drillMs / 100) / 10,
    succeeded: rows.filter((r) => r.status === "succeeded").length,
    recoveryFailed: rows.filter((r) => r.code === "recovery_failed").length,
    otherwiseFailed: rows.filter((r) => r.status === "failed" && r.code !== "recovery_failed").length,
    open: rows.filter((r) => ["queued", "running", "settling"].includes(r.status)).length,
    attemptsCharged: sum("recovery_attempts"),
    freeContinuations: sum("free_continuations"),
    settledAfterLastStartMs: Math.round(settleMs),
    floor: { modelAnswerMs: ANSWER_MS },
    modelCalls: calls,
  };
  console.log(JSON.stringify(out));
  console.log(
    `restart-drill: ${kills} SIGKILLs in ${out.drillSeconds} s over ${n} background delegations: ${out.succeeded} succeeded, ${out.recoveryFailed} recovery_failed; ${out.attemptsCharged} attempts charged, ${out.freeContinuations} free continuations; settled ${out.settledAfterLastStartMs} ms after the last start (one model answer: ${ANSWER_MS} ms)`,
  );
} finally {
  daemon?.child.kill("SIGKILL");
  await daemon?.exited;
  await pool.end();
  model.close();
  await pgSetup.stop();
}
