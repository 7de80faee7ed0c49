#!/usr/bin/env node
// Fork-to-ready time of a sub-agent runner (fork, hello with build identity, boot with policy and catalog,
// boot reply) next to a bare child_process.fork of an empty script (until it exits) and of a script that
// posts one IPC message (until that message arrives), in the same run. The runner imports its turn-time
// code after the boot reply, so fork-to-first-turn (ready, then one scripted turn sent at once) is measured
// too: it shows what the first turn pays for that import. Built code: run `npx tsup` in packages/subagent
// first. A daemon's first delegated session turn usually comes a while after its runners are ready: that turn,
// sent a second after ready, is timed from its send to its outcome (runnerIdleFirstSessionTurn), the
// delegation core's scripted child answering. Prints one JSON object, then a one-line summary.
// Usage: node bench/subagent-fork.mjs [iterations]
import { fork } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os, { tmpdir } from "node:os";
import { join } from "node:path";

const iterations = Number(process.argv[2] ?? 10);
const sub = await import("../packages/subagent/dist/index.js");
const brain = await import("../packages/brain/dist/index.js");
const entry = sub.resolveRunnerEntry(new URL("../packages/subagent/dist/index.js", import.meta.url).href);
const buildId = sub.buildIdentityOf(entry);
const dir = mkdtempSync(join(tmpdir(), "crw-bench-fork-"));
const empty = join(dir, "empty.mjs");
const hello = join(dir, "hello.mjs");
writeFileSync(empty, "");
writeFileSync(hello, "process.send({ ready: true }, () => process.disconnect());\n");

const stats = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))];
  return {
    n: s.length,
    minMs: round(s[0]),
    p50Ms: round(q(0.5)),
    p90Ms: round(q(0.9)),
    maxMs: round(s.at(-1)),
  };
};
const round = (x) => Math.round(x * 100) / 100;

async function bareExit() {
  const t = performance.now();
  const child = fork(empty, [], { stdio: "ignore" });
  await new Promise((r) => child.once("exit", r));
  return performance.now() - t;
}
async function bareIpc() {
  const t = performance.now();
  const child = fork(hello, [], { stdio: "ignore" });
  await new Promise((r) => child.once("message", r));
  const ms = performance.now() - t;
  await new Promise((r) => child.once("exit", r));
  return ms;
}
let turns = 0;
function startRunner() {
  return sub.SubagentRunnerHost.start({
    runnerId: "bench",
    entry,
    buildId,
    retryPolicySource: new sub.MemoryRetryPolicySource({
      revision: 1,
      maxRetries: 0,
      initialDelayMs: 0,
      multiplier: 1,
    }),
    catalog: { revision: 1, public: [], accounts: {} },
  });
}

async function runnerReady(firstTurn = false) {
  const t = performance.now();
  const host = await startRunner();
  if (firstTurn) {
    const n = ++turns;
    await host.runTurn({ turnId: `t-${n}`, channelId: "bench", sessionId: `s-${n}`, prompt: "first" });
  }
  const ms = performance.now() - t;
  await host.shutdown();
  return ms;
}

/** A session turn sent `idleMs` after the runner is ready: its time from send to outcome. */
async function idleFirstSessionTurn(idleMs = 1000) {
  const host = await startRunner();
  await new Promise((r) => setTimeout(r, idleMs));
  const n = ++turns;
  const quiet = {
    record: async () => {},
    beforeToolCall: async () => {},
    drainSteering: async () => [],
    progress: () => {},
  };
  const request = {
    sessionId: `s-${n}`,
    principalAccountId: "acct-bench",
    model: "scripted",
    systemPrompt: "You are a worker.",
    context: [{ role: "user", content: brain.scriptTask({ answer: "done" }) }],
    tools: [],
    scope: brain.parseDelegatedExecutionScope(
      brain.captureDelegatedExecutionScope({ accountId: "acct-bench", target: { kind: "host", ref: null } }),
    ),
    readOnly: false,
    workDir: null,
    signal: new AbortController().signal,
  };
  const t = performance.now();
  const outcome = await host.runSessionTurn(request, quiet, {
    turnId: `st-${n}`,
    channelId: "bench",
    runner: "scripted",
  });
  const ms = performance.now() - t;
  if (outcome.stopReason !== "stop")
    throw new Error(`session turn ended ${outcome.stopReason}: ${outcome.errorMessage}`);
  await host.shutdown();
  return ms;
}

const results = {
  bareForkExit: [],
  bareForkIpc: [],
  runnerReady: [],
  runnerFirstTurn: [],
  runnerIdleFirstSessionTurn: [],
};
for (let i = 0; i < iterations; i++) {
  // Interleaved so machine load affects all of them alike.
  results.bareForkExit.push(await bareExit());
  results.bareForkIpc.push(await bareIpc());
  results.runnerReady.push(await runnerReady());
  results.runnerFirstTurn.push(await runnerReady(true));
  results.runnerIdleFirstSessionTurn.push(await idleFirstSessionTurn());
}
const out = {
  bench: "subagent-fork",
  node: process.version,
  cpus: os.availableParallelism(),
  loadAverage1m: os.loadavg()[0],
  iterations,
  bareForkExit: stats(results.bareForkExit),
  bareForkIpc: stats(results.bareForkIpc),
  runnerReady: stats(results.runnerReady),
  runnerFirstTurn: stats(results.runnerFirstTurn),
  runnerIdleFirstSessionTurn: stats(results.runnerIdleFirstSessionTurn),
};
out.runnerOverP50Ms = round(out.runnerReady.p50Ms - out.bareForkIpc.p50Ms);
out.runnerOverBareIpcP50 = round(out.runnerReady.p50Ms / out.bareForkIpc.p50Ms);
rmSync(dir, { recursive: true, force: true });
console.log(JSON.stringify(out, null, 2));
console.log(
  `load ${os.loadavg()[0].toFixed(1)}; runner fork-to-ready p50 ${out.runnerReady.p50Ms} ms vs bare fork+IPC ${out.bareForkIpc.p50Ms} ms (${out.runnerOverBareIpcP50}x; empty script to exit ${out.bareForkExit.p50Ms} ms; runner fork-to-first-turn ${out.runnerFirstTurn.p50Ms} ms; a first session turn a second after ready ${out.runnerIdleFirstSessionTurn.p50Ms} ms), ${iterations} runs`,
);
