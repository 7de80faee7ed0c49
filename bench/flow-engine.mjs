#!/usr/bin/env node
// Engine overhead per session call (built code: run `npx tsup` in packages/flow first). A workflow of N
// calls (default 500, 4 at a time) runs in this process against the fake app-server (the real JSON-RPC
// protocol over ws on 127.0.0.1) with the scripted owner taking each step as soon as it is written and
// its subagent answering at once. Per call: the time from ctx.call to its result (p50, p99), journal
// bytes and fsyncs; next to this machine's fsync latency (4 KiB write + fdatasync) measured in the run.
// The test kits are TypeScript: they are bundled with esbuild into a temporary directory first.
// The fake host, the owner and the engine share this process: a poll much below 20 ms floods it with reads.
// Prints one JSON object, then a one-line summary. Usage: node bench/flow-engine.mjs [calls] [poll-ms]
import { closeSync, fdatasyncSync, mkdtempSync, openSync, rmSync, statSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { loadFlowKits, writeSessionRun } from "./lib/flow-kits.mjs";

const calls = Number(process.argv[2] ?? 500);
const pollMs = Number(process.argv[3] ?? 20);
const root = mkdtempSync(join(tmpdir(), "crw-bench-engine-"));
const flow = await import("../packages/flow/dist/index.js");
const { FakeAppServer, ScriptedOwner, fileStepSource } = await loadFlowKits();

const pct = (values, p) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0;
};
const round = (x) => Math.round(x * 100) / 100;

// this machine's fsync latency, in the same run
const fsyncMs = [];
{
  const fd = openSync(join(root, "fsync.bin"), "w");
  const block = Buffer.alloc(4096, 1);
  for (let i = 0; i < 200; i++) {
    writeSync(fd, block);
    const t0 = performance.now();
    fdatasyncSync(fd);
    fsyncMs.push(performance.now() - t0);
  }
  closeSync(fd);
}

const fake = await FakeAppServer.start();
const owner = fake.createOwnerThread({ cwd: root });
fake.startOwnerTurn(owner);
const state = join(root, "state");
const { paths, spec } = writeSessionRun(flow, {
  root,
  runId: "bench",
  fake,
  owner,
  pool: 4,
  extra: { poll_ms: pollMs },
});
const host = flow.createAppServerHost({ transport: fake.url });
const schema = { type: "object", required: ["n"], properties: { n: { type: "integer" } } };
const perCall = [];
const workflow = {
  name: "bench",
  async run(ctx) {
    let next = 0;
    const worker = async () => {
      while (next < calls) {
        const i = next++;
        const t0 = performance.now();
        await ctx.call({ role: "explorer", task: `task ${i}`, schema });
        perCall.push(performance.now() - t0);
      }
    };
    await Promise.all([worker(), worker(), worker(), worker()]);
    return perCall.length;
  },
};
const kit = new ScriptedOwner({
  fake,
  owner,
  source: fileStepSource({ state, runId: "bench" }),
  behave: () => ({
    kind: "answer",
    messages: [{ text: '{"n":1}', phase: "final_answer" }],
    usage: { input: 100, output: 10 },
  }),
  idleMs: 1,
}).start();
let stats = null;
const t0 = performance.now();
const outcome = await flow.executeRun({
  paths,
  spec,
  host,
  processToken: null,
  workflow,
  onStats: (s) => (stats = s),
});
const wallMs = performance.now() - t0;
await kit.stop();
await host.close();
await fake.stop();
const journalBytes = statSync(paths.journal).size;
if (process.env.CRW_BENCH_KEEP) process.stderr.write(`journal kept: ${paths.journal}\n`);
else rmSync(root, { recursive: true, force: true });
if (outcome.state !== "completed") throw new Error(`the run did not complete: ${JSON.stringify(outcome)}`);

const result = {
  bench: "flow-engine-overhead",
  calls,
  pool: 4,
  poll_ms: pollMs,
  per_call_ms: { p50: round(pct(perCall, 50)), p99: round(pct(perCall, 99)) },
  throughput_calls_per_s: round(calls / (wallMs / 1000)),
  journal: {
    bytes_per_call: round(journalBytes / calls),
    fsyncs_per_call: stats ? round(stats.fsyncs / calls) : null,
    rows_per_call: stats ? round(stats.rows / calls) : null,
  },
  machine_fsync_ms: { p50: round(pct(fsyncMs, 50)), p99: round(pct(fsyncMs, 99)) },
};
process.stdout.write(`${JSON.stringify(result)}\n`);
process.stdout.write(
  `${calls} session calls: p50 ${result.per_call_ms.p50} ms, p99 ${result.per_call_ms.p99} ms per call (poll ${pollMs} ms), ${result.journal.bytes_per_call} journal bytes and ${result.journal.fsyncs_per_call} fsyncs per call; machine fsync p50 ${result.machine_fsync_ms.p50} ms\n`,
);
