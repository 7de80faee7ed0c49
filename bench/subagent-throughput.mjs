#!/usr/bin/env node
// Delegated turns per second through 1, 2 and 4 runners, next to the in-process path, with the delegation
// core's agent loop (pi-agent-core) and the offline scripted provider; plus RSS per runner (its process tree,
// from the pool's heartbeat bookkeeping). Each turn is a full session turn across the runner boundary: the
// request and context go out, the assistant message comes back through the TurnHost. Built code: run
// `npx tsup` in packages/subagent and packages/brain first. Prints one JSON object, then a one-line summary.
// Usage: node bench/subagent-throughput.mjs [turns]
import { randomUUID } from "node:crypto";
import os from "node:os";

const turns = Number(process.argv[2] ?? 300);
const sub = await import("../packages/subagent/dist/index.js");
const brain = await import("../packages/brain/dist/index.js");
const round = (x) => Math.round(x * 100) / 100;

const host = () => ({
  record: async () => {},
  beforeToolCall: async () => {},
  drainSteering: async () => [],
  progress: () => {},
});
// A delegated child's turn carries its durable scope (root sessions never go to runners).
const scope = brain.parseDelegatedExecutionScope(
  brain.captureDelegatedExecutionScope({ accountId: "bench", target: { kind: "host", ref: null } }),
);
const request = (i) => ({
  sessionId: randomUUID(),
  principalAccountId: "bench",
  model: "scripted",
  systemPrompt: "You are a worker.",
  context: [{ role: "user", content: `task ${i}: summarize the module` }],
  tools: [],
  scope,
  readOnly: false,
  workDir: null,
  signal: new AbortController().signal,
});

async function drive(runner, concurrency) {
  let next = 0;
  let failed = 0;
  const worker = async () => {
    while (next < turns) {
      const i = next++;
      const outcome = await runner.runTurn(request(i), host());
      if (outcome.stopReason !== "stop") failed++;
    }
  };
  const t = performance.now();
  await Promise.all(Array.from({ length: concurrency }, worker));
  const ms = performance.now() - t;
  return { turns, failed, ms: round(ms), turnsPerSecond: round((turns * 1000) / ms) };
}

const inProcessRunner = brain.createAgentTurnRunner();
await inProcessRunner.runTurn(request(-1), host()); // loads pi once, like a warm daemon
const inProcess = { ...(await drive(inProcessRunner, 4)), concurrency: 4 };

const pooled = [];
for (const runners of [1, 2, 4]) {
  const perRunner = 2;
  const pool = new sub.SubagentRunnerPool({
    sizing: () => ({ maxRunners: runners, turnsPerRunner: perRunner }),
    retryPolicySource: () =>
      new sub.MemoryRetryPolicySource({ revision: 1, maxRetries: 0, initialDelayMs: 0, multiplier: 1 }),
    catalog: () => ({ revision: 1, public: [], accounts: {} }),
    heartbeatIntervalMs: 200,
    onEvent: (e) => {
      if (e.type === "turn_dispatched") dispatched++;
    },
  });
  let dispatched = 0;
  const dispatch = new sub.SubagentSessionDispatch({ pool, inProcess: inProcessRunner });
  // Warm every runner (fork, boot, first agent-loop import) before measuring.
  await Promise.all(
    Array.from({ length: runners * perRunner }, (_, i) => dispatch.runTurn(request(-i - 2), host())),
  );
  const result = await drive(dispatch, runners * perRunner);
  // Wait (bounded) until every runner's heartbeat has reported its process-tree memory.
  const until = Date.now() + 10_000;
  while (pool.health().runners.some((r) => r.memoryBytes === null) && Date.now() < until) {
    await new Promise((r) => setTimeout(r, 50));
  }
  const health = pool.health();
  pooled.push({
    runners,
    concurrency: runners * perRunner,
    ...result,
    dispatchedToRunners: dispatched,
    rssPerRunnerMB: health.runners.map((r) =>
      r.memoryBytes === null ? null : round(r.memoryBytes / 2 ** 20),
    ),
    memoryComplete: health.runners.every((r) => r.memoryComplete === true),
  });
  await pool.close();
}

const out = {
  bench: "subagent-throughput",
  node: process.version,
  cpus: os.availableParallelism(),
  loadAverage1m: os.loadavg()[0],
  turns,
  inProcess,
  pooled,
};
console.log(JSON.stringify(out, null, 2));
console.log(
  `load ${os.loadavg()[0].toFixed(1)}; turns/s in-process ${inProcess.turnsPerSecond}; runners ${pooled
    .map((p) => `${p.runners}: ${p.turnsPerSecond}`)
    .join(
      ", ",
    )}; RSS/runner ~${pooled[0]?.rssPerRunnerMB?.[0] ?? "?"} MB (${turns} turns each, scripted provider)`,
);
