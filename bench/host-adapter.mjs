#!/usr/bin/env node
// Host adapter benchmark (built code: run `npx tsup` in packages/flow first). Against the real
// `codex app-server` of the pinned @openai/codex, offline (its own CODEX_HOME; no model is called),
// listening on its control socket, measures:
//   - a cold adapter: open the transport, initialize, first thread/read (what a fresh `crw` process pays),
//     over the control socket directly (unix://) and through `codex app-server proxy` (crw's default);
//   - warm thread/read (with turns) and listSubagents round trips on an open connection, both transports;
//   - readTokenCount on a large rollout file (the last token_count is found by reading backwards).
// Prints one JSON object, then a one-line summary. Usage: node bench/host-adapter.mjs [warm-requests]
import { spawn } from "node:child_process";
import { appendFileSync, existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { Socket } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";

const warmRequests = Number(process.argv[2] ?? 300);
const flow = await import("../packages/flow/dist/index.js");
const require = createRequire(import.meta.url);

function nativeCodex() {
  const launcher = require.resolve("@openai/codex/package.json");
  const triple = process.arch === "arm64" ? "aarch64-unknown-linux-musl" : "x86_64-unknown-linux-musl";
  const pkg = process.arch === "arm64" ? "@openai/codex-linux-arm64" : "@openai/codex-linux-x64";
  const root = dirname(require.resolve(`${pkg}/package.json`, { paths: [dirname(launcher)] }));
  const bin = join(root, "vendor", triple, "bin", "codex");
  if (!existsSync(bin)) throw new Error(`no native codex at ${bin}`);
  return bin;
}

const pct = (values, p) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0;
};
const round = (x) => Math.round(x * 100) / 100;
const stats = (values) => ({
  n: values.length,
  p50_ms: round(pct(values, 50)),
  p99_ms: round(pct(values, 99)),
});

const home = mkdtempSync(join(tmpdir(), "crw-bench-host-"));
writeFileSync(
  join(home, "config.toml"),
  `model = "mock-model"
model_provider = "mock"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
[model_providers.mock]
name = "none"
base_url = "http://127.0.0.1:9/v1"
wire_api = "responses"
[analytics]
enabled = false
[features]
plugins = false
apps = false
remote_plugin = false
`,
);
const codex = nativeCodex();
const server = spawn(codex, ["app-server", "--listen", "unix://"], {
  cwd: home,
  env: { ...process.env, CODEX_HOME: home },
  stdio: "ignore",
});
const socket = join(home, "app-server-control", "app-server-control.sock");
const accepts = () =>
  new Promise((resolve) => {
    const s = new Socket();
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
    s.connect(socket);
  });
const deadline = Date.now() + 20_000;
while (!(await accepts())) {
  if (Date.now() > deadline) throw new Error("app-server did not listen");
  await new Promise((r) => setTimeout(r, 50));
}

const env = { ...process.env, CODEX_HOME: home };
const transports = {
  socket: () => flow.hostTransportFromSpec(`unix://${socket}`, env),
  proxy: () => flow.hostTransportFromSpec(`${codex} app-server proxy`, env),
};

try {
  const setup = flow.createAppServerHost({ transport: transports.socket() });
  const started = await setup.request("thread/start", { cwd: home });
  if (!started.ok) throw new Error(started.message);
  const threadId = started.value.thread.id;
  await setup.close();

  const result = { app_server: "codex-cli 0.171.0", warm_requests: warmRequests };
  for (const [name, make] of Object.entries(transports)) {
    const cold = [];
    for (let i = 0; i < 15; i++) {
      const t0 = performance.now();
      const host = flow.createAppServerHost({ transport: make() });
      const read = await host.readThread(threadId);
      cold.push(performance.now() - t0);
      if (!read.ok) throw new Error(read.message);
      await host.close();
    }
    const host = flow.createAppServerHost({ transport: make() });
    await host.readThread(threadId);
    const reads = [];
    const lists = [];
    for (let i = 0; i < warmRequests; i++) {
      let t0 = performance.now();
      await host.readThread(threadId);
      reads.push(performance.now() - t0);
      t0 = performance.now();
      await host.listSubagents(threadId);
      lists.push(performance.now() - t0);
    }
    await host.close();
    result[name] = { cold_first_read: stats(cold), thread_read: stats(reads), list_subagents: stats(lists) };
  }

  // A rollout of ~8 MB: many response lines after the last token_count.
  const rollout = join(home, "big-rollout.jsonl");
  const filler = JSON.stringify({
    type: "response_item",
    payload: { type: "message", text: "x".repeat(2_000) },
  });
  appendFileSync(
    rollout,
    `${JSON.stringify({ type: "event_msg", payload: { type: "token_count", info: { total_token_usage: { input_tokens: 1, cached_input_tokens: 0, output_tokens: 1, reasoning_output_tokens: 0, total_tokens: 2 } } } })}\n`,
  );
  appendFileSync(rollout, `${filler}\n`.repeat(4_000));
  const tokenReads = [];
  for (let i = 0; i < 30; i++) {
    const t0 = performance.now();
    await flow.readRolloutTokenCount(rollout);
    tokenReads.push(performance.now() - t0);
  }
  const tail = join(home, "tail-rollout.jsonl");
  appendFileSync(tail, `${filler}\n`.repeat(4_000));
  appendFileSync(
    tail,
    `${JSON.stringify({ type: "event_msg", payload: { type: "token_count", info: { total_token_usage: { input_tokens: 1, cached_input_tokens: 0, output_tokens: 1, reasoning_output_tokens: 0, total_tokens: 2 } } } })}\n`,
  );
  const tailReads = [];
  for (let i = 0; i < 30; i++) {
    const t0 = performance.now();
    await flow.readRolloutTokenCount(tail);
    tailReads.push(performance.now() - t0);
  }
  result.rollout_token_count = {
    file_mb: 8,
    count_at_start: stats(tokenReads),
    count_at_end: stats(tailReads),
  };
  console.log(JSON.stringify(result, null, 2));
  console.log(
    `host adapter vs codex app-server: cold first read ${result.socket.cold_first_read.p50_ms} ms (socket) / ${result.proxy.cold_first_read.p50_ms} ms (proxy) p50; ` +
      `warm thread/read p50 ${result.socket.thread_read.p50_ms} / ${result.proxy.thread_read.p50_ms} ms, p99 ${result.socket.thread_read.p99_ms} / ${result.proxy.thread_read.p99_ms} ms; ` +
      `token count from an 8 MB rollout ${result.rollout_token_count.count_at_end.p50_ms} ms (at the end) / ${result.rollout_token_count.count_at_start.p50_ms} ms (at the start) p50`,
  );
} finally {
  server.kill("SIGTERM");
  rmSync(home, { recursive: true, force: true });
}
