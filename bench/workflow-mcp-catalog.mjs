#!/usr/bin/env node
import { loadavg } from "node:os";
// MCP bridge and tool-catalog benchmark (built code: run `npx tsup` in packages/db and packages/brain first).
// A real MCP server process (the official SDK's server over stdio, twelve tools) is started through
// McpBridge, then:
//   - bridge start: spawn + initialize + tool listing, to bridged host tools,
//   - call latency: sequential calls of a bridged tool (daemon -> server -> daemon), p50 / p95,
//   - catalog planning: applyCatalog over a child turn's request (4 child tools + 6 native + 12 bridged,
//     deferred past the threshold), per request.
// Prints one JSON object, then a one-line summary. Usage: node bench/workflow-mcp-catalog.mjs [calls]
import { resolve } from "node:path";

const calls = Number(process.argv[2] ?? 500);
const brain = await import("../packages/brain/dist/index.js");
const server = resolve(import.meta.dirname, "../tools/src/mcp/tools-server.mjs");

const t0 = performance.now();
const bridge = await brain.McpBridge.start({
  servers: { calc: { command: process.execPath, args: [server, "12"] } },
});
const startMs = performance.now() - t0;
const tools = bridge.tools();
const add = tools.find((t) => t.name === "mcp__calc__add");
const ctx = {
  sessionId: "bench",
  principalAccountId: "bench",
  toolCallId: "c",
  readOnly: false,
  workDir: null,
  signal: new AbortController().signal,
  progress: () => {},
};
for (let i = 0; i < 20; i++) await add.execute({ a: i, b: 1 }, ctx);
const lat = [];
for (let i = 0; i < calls; i++) {
  const s = performance.now();
  await add.execute({ a: i, b: 2 }, ctx);
  lat.push(performance.now() - s);
}
await bridge.close();
lat.sort((x, y) => x - y);
const q = (p) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))];

const native = [
  "Delegate",
  "DelegateContinue",
  "DelegateRead",
  "WorkflowStart",
  "WorkflowResume",
  "WorkflowCancel",
];
const turnTool = (name) => ({
  name,
  description: `the ${name} tool`,
  parameters: { type: "object" },
  execute: async () => ({ content: "" }),
});
const scope = brain.parseDelegatedExecutionScope(
  brain.captureDelegatedExecutionScope({
    accountId: "acc",
    target: { kind: "host", ref: null },
    workDir: "/tmp",
  }),
);
const request = {
  sessionId: "s",
  principalAccountId: "acc",
  model: "scripted",
  systemPrompt: "p",
  context: [],
  tools: [...native.map(turnTool), ...tools],
  scope,
  readOnly: false,
  workDir: "/tmp",
  signal: new AbortController().signal,
};
const plans = 20_000;
let plan;
const p0 = performance.now();
for (let i = 0; i < plans; i++) plan = brain.applyCatalog(request).plan;
const planUs = ((performance.now() - p0) / plans) * 1000;

const out = {
  mcpTools: tools.length,
  bridgeStartMs: Math.round(startMs),
  calls,
  callP50Ms: Number(q(0.5).toFixed(3)),
  callP95Ms: Number(q(0.95).toFixed(3)),
  catalog: { complete: plan.complete.length, declared: plan.declared.length, deferred: plan.deferred.length },
  applyCatalogUs: Number(planUs.toFixed(2)),
  load1: Number(loadavg()[0].toFixed(1)),
};
console.log(JSON.stringify(out));
console.log(
  `MCP bridge: start ${out.bridgeStartMs} ms (${out.mcpTools} tools), call p50 ${out.callP50Ms} ms / p95 ${out.callP95Ms} ms over ${calls}; catalog ${out.catalog.complete} -> ${out.catalog.declared} declared + ${out.catalog.deferred} deferred in ${out.applyCatalogUs} us per request (load ${out.load1})`,
);
