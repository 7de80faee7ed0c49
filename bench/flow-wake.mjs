#!/usr/bin/env node
// Wake latency (built code: run `npx tsup` in packages/flow first): from a step's publication to the new
// turn the run starts on the idle owner thread (session_step_waiting through the host's turn/start), on the
// fake app-server over ws. A workflow of N calls one after the other; after each wake the bench answers
// the step (spawn, dispatch report, final answer) and ends the owner's turn so it is idle again.
// With `busy` the owner is in a turn when each step is published: the wake is held and the latency is from
// the end of that turn to the wake's new turn (delivered after the current turn).
// Prints one JSON object, then a one-line summary. Usage: node bench/flow-wake.mjs [calls] [poll-ms] [busy]
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { loadFlowKits, writeSessionRun } from "./lib/flow-kits.mjs";

const calls = Number(process.argv[2] ?? 30);
const pollMs = Number(process.argv[3] ?? 100);
const busy = process.argv[4] === "busy";
const root = mkdtempSync(join(tmpdir(), "crw-bench-wake-"));
const flow = await import("../packages/flow/dist/index.js");
const { FakeAppServer } = await loadFlowKits();

const fake = await FakeAppServer.start();
const owner = fake.createOwnerThread({ cwd: root });
if (busy) fake.startOwnerTurn(owner); // the owner is in a turn when the first step is published
const { paths, spec } = writeSessionRun(flow, {
  root,
  runId: "bench-wake",
  fake,
  owner,
  pool: 1,
  extra: { poll_ms: pollMs, wake_after_ms: 3_600_000 },
});
const schema = { type: "object", required: ["n"], properties: { n: { type: "integer" } } };
const workflow = flow.defineWorkflow({
  name: "bench-wake",
  async run(ctx) {
    for (let i = 0; i < calls; i++) await ctx.call({ role: "explorer", task: `call ${i}`, schema });
    return calls;
  },
});
const published = new Map();
const latencies = [];
fake.onTurnStart((thread, _turn, text) => {
  if (thread !== owner || !text.startsWith("session_step_waiting")) return;
  const t1 = performance.now();
  const [marker, t0] = [...published.entries()].at(-1) ?? [];
  if (marker === undefined) return;
  published.delete(marker);
  latencies.push(t1 - (busy ? (turnEnded.get(marker) ?? t0) : t0));
  setImmediate(() => answer(marker));
});
const turnEnded = new Map();
function answer(marker) {
  const step = flow.listStepFiles(paths.steps).steps.find((s) => s.marker === marker);
  if (!step) return setTimeout(() => answer(marker), 5);
  const a = fake.spawnSubagent({ ownerThreadId: owner, message: step.message, agentRole: "explorer" });
  flow.writeReport(paths.inbox, {
    format: "crw-flow-dispatch/1",
    run_id: spec.run_id,
    call: step.call,
    k: step.k,
    attempt: step.attempt,
    agent_id: a.threadId,
    at: new Date().toISOString(),
  });
  fake.answer(a.threadId, '{"n":1}');
  // the owner's woken turn ends: idle for the next step (busy: it stays in that turn until after the next
  // publish)
  if (!busy) fake.completeTurn(owner);
}
const host = flow.createAppServerHost({ transport: fake.url });
const outcome = await flow.executeRun({
  paths,
  spec,
  host,
  processToken: null,
  workflow,
  onEvent: (e) => {
    if (e.type !== "step_published") return;
    published.set(e.marker, performance.now());
    if (busy) {
      // the owner's turn ends a little after the publish
      setTimeout(() => {
        turnEnded.set(e.marker, performance.now());
        fake.completeTurn(owner);
      }, 30);
    }
  },
});
await host.close();
await fake.stop();
rmSync(root, { recursive: true, force: true });
const sorted = [...latencies].sort((a, b) => a - b);
const pct = (p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0;
const r2 = (x) => Math.round(x * 10) / 10;
const out = {
  bench: "flow-wake-latency",
  calls,
  poll_ms: pollMs,
  owner: busy ? "busy (latency from the end of its turn)" : "idle (latency from the publish)",
  outcome: outcome.state,
  wakes: latencies.length,
  p50_ms: r2(pct(50)),
  p90_ms: r2(pct(90)),
  max_ms: r2(sorted.at(-1) ?? 0),
};
console.log(JSON.stringify(out));
console.log(
  `wake latency (${busy ? "end of the busy owner's turn" : "publish"} -> owner's new turn), ${latencies.length} wakes, poll ${pollMs} ms: p50 ${out.p50_ms} ms, p90 ${out.p90_ms} ms`,
);
