#!/usr/bin/env node
// crw flow on the local backend with the offline scripted provider, through the built CLI: a workflow of
// N schema-validated calls (pool 4) runs in the detached run process; the figures come from the journal
// (per call: turn_started → completed; rows and journal bytes per call) and the wall time of the run.
// Usage: node bench/flow-backend-local.mjs [calls=200]   (after npm run build, or npx tsup in packages/flow and apps/crw)
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const calls = Number(process.argv[2] ?? 200);
const root = resolve(import.meta.dirname, "..");
const crw = join(root, "apps/crw/bin/crw.mjs");
const dir = mkdtempSync(join(tmpdir(), "crw-bench-flow-local-"));
const workflow = join(dir, "bench.mjs");
writeFileSync(
  workflow,
  `export default { name: "bench", async run(ctx, input) {
    const schema = { type: "object", required: ["n"], properties: { n: { type: "integer" } } };
    const out = await Promise.all(Array.from({ length: input.calls }, (_, i) =>
      ctx.call({ role: "explorer", node: "c", task: "answer " + i, schema })));
    return out.length;
  } };`,
);
const script = join(dir, "script.json");
writeFileSync(script, JSON.stringify({ calls: { "*": [{ text: '{"n": 1}' }] } }));
const env = { ...process.env };
delete env.CODEX_THREAD_ID;
const state = join(dir, "state");
const t0 = Date.now();
execFileSync(
  process.execPath,
  [
    crw,
    "flow",
    "start",
    workflow,
    "--state",
    state,
    "--run",
    "b",
    "--script",
    script,
    "--input",
    JSON.stringify({ calls }),
  ],
  // in the temp directory: no git checkout, so the run makes no branch (bench/flow-branch.mjs measures that)
  { env, stdio: "ignore", cwd: dir },
);
const journal = join(state, "flow", "b", "journal.jsonl");
let rows = [];
for (;;) {
  if (existsSync(journal)) {
    rows = readFileSync(journal, "utf8")
      .split("\n")
      .slice(1)
      .filter(Boolean)
      .map((l) => JSON.parse(l));
    if (rows.some((r) => r.type === "run_ended")) break;
  }
  if (Date.now() - t0 > 600_000) throw new Error("the run did not end in 10 minutes");
  await new Promise((r) => setTimeout(r, 20));
}
const wallMs = Date.now() - t0;
const startedAt = new Map();
const lat = [];
for (const r of rows) {
  if (r.type === "turn_started" && !startedAt.has(r.call)) startedAt.set(r.call, Date.parse(r.at));
  if (r.type === "completed") lat.push(Date.parse(r.at) - (startedAt.get(r.call) ?? Date.parse(r.at)));
}
lat.sort((a, b) => a - b);
const q = (p) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] ?? 0;
const result = {
  bench: "flow-backend-local",
  calls,
  completed: lat.length,
  status: rows.find((r) => r.type === "run_ended")?.status,
  wall_ms: wallMs,
  calls_per_s: Number(((lat.length * 1000) / wallMs).toFixed(1)),
  turn_ms: { p50: q(0.5), p99: q(0.99) },
  rows_per_call: Number((rows.length / calls).toFixed(2)),
  journal_bytes_per_call: Math.round(statSync(journal).size / calls),
};
rmSync(dir, { recursive: true, force: true });
process.stdout.write(`${JSON.stringify(result)}\n`);
process.stdout.write(
  `local backend, scripted: ${result.completed}/${calls} calls in ${wallMs} ms (${result.calls_per_s}/s incl. start), turn p50 ${result.turn_ms.p50} ms p99 ${result.turn_ms.p99} ms, ${result.rows_per_call} rows and ${result.journal_bytes_per_call} journal bytes per call\n`,
);
