#!/usr/bin/env node
// Child-turn and scope benchmark for @crw/brain (built code: run `npx tsup` in packages/brain first).
// Measures, with the offline scripted provider at zero latency and real tools on real files:
//   - the one-time cost of loading pi-agent-core/pi-ai on the first turn,
//   - child turns per second (each turn: a write, an edit, a read and a shell tool round, then an answer),
//   - scope captures and read-only continuation clamps per second.
// Prints one JSON object, then a one-line summary. Usage: node bench/brain-agent-turn.mjs [turns]
import { mkdtempSync, realpathSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const turns = Number(process.argv[2] ?? 200);
const importStart = performance.now();
const brain = await import("../packages/brain/dist/index.js");
const brainImportMs = performance.now() - importStart;
const piStart = performance.now();
await brain.loadPi();
const piLoadMs = performance.now() - piStart;

const dir = realpathSync(mkdtempSync(join(tmpdir(), "crw-bench-turn-")));
const scope = brain.captureDelegatedExecutionScope({
  accountId: "bench",
  target: { kind: "host", ref: null },
  workDir: dir,
});
const script = [
  { toolCalls: [{ name: "write", arguments: { path: "f.txt", content: "alpha\nbeta\n" } }] },
  { toolCalls: [{ name: "edit", arguments: { path: "f.txt", oldText: "beta", newText: "gamma" } }] },
  {
    toolCalls: [
      { name: "read", arguments: { path: "f.txt" } },
      { name: "shell", arguments: { command: "true" } },
    ],
  },
  { text: "done" },
];

const latencies = [];
let providerCalls = 0;
let toolCalls = 0;
const turnStart = performance.now();
for (let i = 0; i < turns; i++) {
  const t = performance.now();
  const out = await brain.runChildTurn({
    sessionId: `bench-${i}`,
    systemPrompt: "bench worker",
    messages: [],
    input: `task ${i}`,
    scope,
    workDir: dir,
    model: { api: "scripted", script },
  });
  if (out.stopReason !== "stop")
    throw new Error(`turn ${i} ended with ${out.stopReason}: ${out.errorMessage}`);
  latencies.push(performance.now() - t);
  providerCalls += out.usage.providerCalls;
  toolCalls += out.toolCalls.length;
}
const turnSeconds = (performance.now() - turnStart) / 1000;
rmSync(dir, { recursive: true, force: true });

const captures = 20_000;
const capStart = performance.now();
for (let i = 0; i < captures; i++) {
  const stored = brain.captureDelegatedExecutionScope(
    {
      accountId: "bench",
      target: { kind: "host", ref: "p" },
      workDir: "/srv/p",
      tools: { allow: ["read", "write", "shell(git *)", "mcp__gh__*"], deny: ["shell(git push*)"] },
    },
    { accountId: "bench", tools: { allow: ["read", "shell", "mcp__*"], deny: ["write(secrets/*)"] } },
  );
  brain.readOnlyContinuationScope(stored, { accountId: "bench", tools: { allow: ["read", "shell(git *)"] } });
}
const captureSeconds = (performance.now() - capStart) / 1000;

latencies.sort((a, b) => a - b);
const pct = (p) => latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))];
const result = {
  bench: "brain-agent-turn",
  turns,
  brainImportMs: Number(brainImportMs.toFixed(1)),
  piLoadMs: Number(piLoadMs.toFixed(1)),
  turnsPerSecond: Number((turns / turnSeconds).toFixed(1)),
  turnLatencyMs: { p50: Number(pct(50).toFixed(2)), p99: Number(pct(99).toFixed(2)) },
  providerCallsPerTurn: providerCalls / turns,
  toolCallsPerTurn: toolCalls / turns,
  captureAndClampPerSecond: Math.round(captures / captureSeconds),
};
console.log(JSON.stringify(result));
console.log(
  `brain-agent-turn: ${result.turnsPerSecond} child turns/s (4 provider requests, 4 real tool calls each; p50 ${result.turnLatencyMs.p50} ms, p99 ${result.turnLatencyMs.p99} ms); pi load ${result.piLoadMs} ms once; ${result.captureAndClampPerSecond} scope capture+clamp/s`,
);
