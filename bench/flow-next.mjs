#!/usr/bin/env node
// `crw flow next RUN --json` as a cold process, next to `node -e 0` in the same run (built code: run
// `npx tsup` in packages/flow and apps/crw first). The owner runs `next` once per step, so its start must
// stay close to bare node: the fixture is a live run (this process holds its run and process locks and its
// started row names them) with a journal of 200 calls (second argument) and 4 waiting steps: `next` reads
// only what was appended since the fold it keeps, so its time should not grow with the calls.
// Prints one JSON object, then a one-line summary. Usage: node bench/flow-next.mjs [rounds] [calls]
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";

const rounds = Number(process.argv[2] ?? 20);
const calls = Number(process.argv[3] ?? 200);
const flow = await import("../packages/flow/dist/index.js");
const crw = new URL("../apps/crw/bin/crw.mjs", import.meta.url).pathname;

const root = mkdtempSync(join(tmpdir(), "crw-bench-next-"));
const state = join(root, "state");
const paths = flow.runPaths(state, "bench");
mkdirSync(paths.dir, { recursive: true });
flow.writeSpec(paths.spec, {
  format: flow.SPEC_FORMAT,
  run_id: "bench",
  workflow: join(root, "w.mjs"),
  workflow_name: "bench",
  input: null,
  backend: "session",
  owner: "owner-thread",
  pool: 4,
  repo: root,
  host: "ws://127.0.0.1:1",
  created_at: new Date().toISOString(),
  env: { TMPDIR: tmpdir() },
});
const token = "beefbeefbeef";
flow.tryLock(join(paths.dir, `process.${token}.lock`), { pid: process.pid, token });
flow.tryLock(paths.runLock, { pid: process.pid, token });
const w = flow.JournalWriter.create(paths.journal, "bench");
const pairs = Object.fromEntries(
  ["architect", "executor", "executor-t1", "reviewer", "explorer", "critic"].map((r) => [
    r,
    { model: null, effort: null },
  ]),
);
w.append([
  {
    type: "started",
    backend: "session",
    role_pairs: pairs,
    policy_digest: flow.readRoleTable(root).policy_digest,
    process: token,
    pid: process.pid,
    process_n: 1,
  },
]);
for (let i = 1; i <= calls; i++) {
  const call = `explorer.${i}`;
  const input = { role: "explorer", task: `task ${i}`, schema: null, workspace: null };
  w.append([
    {
      type: "prepared",
      call,
      op: call,
      role: "explorer",
      input,
      input_digest: flow.digestOf(input),
      backend: "session",
      allocation: { workspace: join(paths.workspaces, call), kind: "scratch" },
    },
  ]);
  w.append([
    {
      type: "completed",
      call,
      op: call,
      k: 1,
      attempt: 1,
      result: { n: i },
      result_digest: "sha256:x",
      raw_text: "{}",
      extracted: false,
      tokens: { input: 10 },
    },
  ]);
}
w.close();
const bus = new flow.FileStepBus(paths.steps);
for (let i = 1; i <= 4; i++) {
  const call = `reviewer.${i}`;
  const packet = join(paths.steps, call, "packet-t1-a1.md");
  const ws = join(paths.workspaces, call);
  bus.writeStep(
    {
      run_id: "bench",
      call,
      k: 1,
      attempt: 1,
      op: `${call}/t1`,
      marker: `${call}/t1-a1`,
      role: "reviewer",
      action: "spawn",
      agent_type: "reviewer",
      model: null,
      reasoning_effort: null,
      message: flow.spawnMessage(`${call}/t1-a1`, "reviewer", ws, packet),
      packet,
      workspace: ws,
      agent_id: null,
    },
    "# packet\n",
  );
}

const time = (args) => {
  const t0 = performance.now();
  execFileSync(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
  return performance.now() - t0;
};
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const bare = [];
const next = [];
time(["-e", "0"]);
const check = JSON.parse(
  execFileSync(process.execPath, [crw, "flow", "next", "bench", "--state", state, "--json"], {
    encoding: "utf8",
  }),
);
if (check.steps.length !== 4 || check.state !== "waiting_session")
  throw new Error(`unexpected next answer: ${check.state}, ${check.steps.length} steps`);
for (let i = 0; i < rounds; i++) {
  bare.push(time(["-e", "0"]));
  next.push(time([crw, "flow", "next", "bench", "--state", state, "--json"]));
}
rmSync(root, { recursive: true, force: true });
const result = {
  bench: "flow-next-cold",
  rounds,
  node_e0_median_ms: Math.round(median(bare) * 10) / 10,
  next_json_median_ms: Math.round(median(next) * 10) / 10,
  ratio: Math.round((median(next) / median(bare)) * 100) / 100,
  fixture: { calls, waiting_steps: 4 },
};
process.stdout.write(`${JSON.stringify(result)}\n`);
process.stdout.write(
  `crw flow next --json cold, ${calls} calls in the journal: ${result.next_json_median_ms} ms median vs node -e 0 ${result.node_e0_median_ms} ms (${result.ratio}x)\n`,
);
