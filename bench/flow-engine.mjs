#!/usr/bin/env node
// Engine overhead per session call (built code: run `npx tsup` in packages/flow first). A workflow of N
// calls (default 500, 4 at a time: in-flight) runs in this process against the fake app-server (the real JSON-RPC
// protocol over ws on 127.0.0.1) with the scripted owner taking each step as soon as it is written and
// its subagent answering at once. Per call: the time from ctx.call to its result (p50, p99), journal
// bytes and fsyncs; next to this machine's fsync latency (4 KiB write + fdatasync) measured in the run.
// The test kits are TypeScript: they are bundled with esbuild into a temporary directory first.
// The fake host, the owner and the engine share this process, so the owner's own reads count against the
// engine: the default owner source (`watch`) reads a call's step directory when fs.watch says it changed
// (a full listing every 250 ms as the fallback; one watch of steps/ and one of each call directory); `files` is the test kit's source, which lists every call's
// directory and reads the whole journal every round (1 ms apart), as a worst-case owner.
// Prints one JSON object, then a one-line summary.
// The owner's side (fake host and scripted owner) shares the engine's event loop by default (`inline`);
// `worker` gives it a worker thread, an event loop of its own as the host and the owner have in a real run
// (on a machine with few cores the thread hops cost more than they save); `process` a process of its own,
// as the host and the owner are in a real run (the figures of this process are then the engine's alone).
// Usage: node bench/flow-engine.mjs [calls] [poll-ms] [watch|files] [inline|worker|process] [in-flight]
// A run removes its state at the end (thousands of files). Where a new file costs more after deletions
// (ext4 without a journal: `machine_new_file_ms.before` tells), a run made right after another pays for the
// other's removal: CRW_BENCH_KEEP=1 keeps the state, to be removed after the runs being compared.
import { fork } from "node:child_process";
import {
  closeSync,
  existsSync,
  fdatasyncSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { isMainThread, parentPort, Worker, workerData } from "node:worker_threads";
import { loadFlowKits, watchedStepSource, writeSessionRun } from "./lib/flow-kits.mjs";
import { cpuUnitMs } from "./lib/machine.mjs";

const calls = Number(process.argv[2] ?? 500);
const pollMs = Number(process.argv[3] ?? 20);
const sourceKind = process.argv[4] ?? "watch";
if (sourceKind !== "watch" && sourceKind !== "files")
  throw new Error(`owner source ${sourceKind}: watch or files`);
const placement = process.argv[5] ?? "inline";
// the owner's side in a process of its own: this script again, told so (and where the run lives) by env
const ownerProcess = process.env.CRW_BENCH_OWNER_SIDE ? JSON.parse(process.env.CRW_BENCH_OWNER_SIDE) : null;
// calls in flight at once (the figures of the issue are taken at 4)
const inFlight = Number(process.argv[6] ?? 4);
if (placement !== "worker" && placement !== "inline" && placement !== "process")
  throw new Error(`owner side ${placement}: worker, process or inline`);
const root = ownerProcess
  ? ownerProcess.root
  : isMainThread
    ? mkdtempSync(join(tmpdir(), "crw-bench-engine-"))
    : workerData.root;
const flow = await import("../packages/flow/dist/index.js");

const pct = (values, p) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0;
};
const round = (x) => Math.round(x * 100) / 100;

// The main thread's own CPU time in ms (Linux: /proc), null elsewhere. With the owner's side in a worker it
// is the engine's share alone: the process's figure also holds the worker and libuv's file threads.
function mainThreadCpuMs() {
  const stat = `/proc/self/task/${process.pid}/stat`;
  if (!existsSync(stat)) return null;
  const fields = readFileSync(stat, "utf8").split(") ")[1].split(" ");
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
}

// this machine's fsync latency, in the same run
function machineFsyncMs() {
  const out = [];
  const fd = openSync(join(root, "fsync.bin"), "w");
  const block = Buffer.alloc(4096, 1);
  for (let i = 0; i < 200; i++) {
    writeSync(fd, block);
    const t0 = performance.now();
    fdatasyncSync(fd);
    out.push(performance.now() - t0);
  }
  closeSync(fd);
  return out;
}

// What a new file costs where the run's state lives, in the same run: a directory made, then a small file
// written under a temporary name and renamed into place in it, as the step bus writes each of its files. On
// a file system whose cost per new file grows with the files deleted in the last minutes (ext4 without a
// journal skips recently freed inodes one by one when it allocates one), the figure after the run shows
// what the run's own churn left the later writes of the run to pay.
let newFileRound = 0;
function machineNewFileMs() {
  const base = join(root, `new-files-${newFileRound++}`);
  mkdirSync(base);
  const dirMs = [];
  const fileMs = [];
  const text = "x".repeat(600);
  for (let i = 0; i < 100; i++) {
    const dir = join(base, `d${i}`);
    const t0 = performance.now();
    mkdirSync(dir);
    const t1 = performance.now();
    writeFileSync(join(dir, ".tmp"), text);
    renameSync(join(dir, ".tmp"), join(dir, "f.json"));
    fileMs.push(performance.now() - t1);
    dirMs.push(t1 - t0);
  }
  return {
    mkdir_p50: round(pct(dirMs, 50)),
    file_p50: round(pct(fileMs, 50)),
    file_p99: round(pct(fileMs, 99)),
  };
}

// The owner's side: the fake host, its owner thread in a turn, the scripted owner taking steps.
async function ownerSide({ root, ownerSource }) {
  const { FakeAppServer, ScriptedOwner, fileStepSource } = await loadFlowKits({ build: false });
  const fake = await FakeAppServer.start();
  const owner = fake.createOwnerThread({ cwd: root });
  fake.startOwnerTurn(owner);
  const state = join(root, "state");
  const source =
    ownerSource === "watch"
      ? watchedStepSource(flow, { state, runId: "bench" })
      : fileStepSource({ state, runId: "bench" });
  const kit = new ScriptedOwner({
    fake,
    owner,
    source,
    behave: () => ({
      kind: "answer",
      messages: [{ text: '{"n":1}', phase: "final_answer" }],
      usage: { input: 100, output: 10 },
    }),
    idleMs: 1,
  }).start();
  return {
    url: fake.url,
    owner,
    async stop() {
      await kit.stop();
      source.close?.();
      await fake.stop();
    },
  };
}

if (ownerProcess) {
  const side = await ownerSide(ownerProcess);
  process.send({ url: side.url, owner: side.owner });
  process.once("message", async () => {
    await side.stop();
    process.send("stopped", () => process.disconnect());
  });
} else if (!isMainThread) {
  const side = await ownerSide(workerData);
  parentPort.postMessage({ url: side.url, owner: side.owner });
  parentPort.once("message", async () => {
    await side.stop();
    parentPort.postMessage("stopped");
    parentPort.close();
  });
} else {
  await main();
}

// The owner's side in a worker thread (its own event loop, as the host and the owner are other processes
// in a real run), or inline on the engine's own loop.
async function startOwnerSide(opts) {
  if (placement === "inline") return ownerSide(opts);
  if (placement === "process") return ownerSideProcess(opts);
  const worker = new Worker(new URL(import.meta.url), { workerData: opts, argv: process.argv.slice(2) });
  const ready = await new Promise((resolve, reject) => {
    worker.once("message", resolve);
    worker.once("error", reject);
  });
  return {
    ...ready,
    async stop() {
      const stopped = new Promise((resolve) => worker.once("message", resolve));
      worker.postMessage("stop");
      await stopped;
      await worker.terminate();
    },
  };
}

// The owner's side in a child process, as the host and the owner are in a real run (Codex's own process).
async function ownerSideProcess(opts) {
  const child = fork(fileURLToPath(import.meta.url), process.argv.slice(2), {
    env: { ...process.env, CRW_BENCH_OWNER_SIDE: JSON.stringify(opts) },
  });
  const ready = await new Promise((resolve, reject) => {
    child.once("message", resolve);
    child.once("error", reject);
    child.once("exit", (code) => reject(new Error(`the owner's side exited (${code})`)));
  });
  return {
    ...ready,
    // its CPU is not in this process's figures
    async stop() {
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.send("stop");
      await exited;
    },
  };
}

async function main() {
  await loadFlowKits();
  const fsyncMs = machineFsyncMs();
  const newFileBefore = machineNewFileMs();
  const cpuUnit = cpuUnitMs();
  const side = await startOwnerSide({ root, ownerSource: sourceKind });
  const { paths, spec } = writeSessionRun(flow, {
    root,
    runId: "bench",
    fake: { url: side.url },
    owner: side.owner,
    pool: 4,
    extra: { poll_ms: pollMs },
  });
  const host = flow.createAppServerHost({ transport: side.url });
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
      await Promise.all(Array.from({ length: inFlight }, worker));
      return perCall.length;
    },
  };
  let stats = null;
  const t0 = performance.now();
  const cpu0 = process.cpuUsage();
  const main0 = mainThreadCpuMs();
  const outcome = await flow.executeRun({
    paths,
    spec,
    host,
    processToken: null,
    workflow,
    onStats: (s) => (stats = s),
  });
  const wallMs = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  const main1 = mainThreadCpuMs();
  const newFileAfter = machineNewFileMs();
  await side.stop();
  await host.close();
  const journalBytes = statSync(paths.journal).size;
  if (process.env.CRW_BENCH_KEEP) process.stderr.write(`journal kept: ${paths.journal}\n`);
  else rmSync(root, { recursive: true, force: true });
  if (outcome.state !== "completed") throw new Error(`the run did not complete: ${JSON.stringify(outcome)}`);

  const result = {
    bench: "flow-engine-overhead",
    calls,
    pool: 4,
    in_flight: inFlight,
    poll_ms: pollMs,
    owner_source: sourceKind,
    owner_side: placement,
    per_call_ms: { p50: round(pct(perCall, 50)), p99: round(pct(perCall, 99)) },
    throughput_calls_per_s: round(calls / (wallMs / 1000)),
    // the process's CPU time (every thread: engine, host, owner) over the run, per call
    cpu_ms_per_call: round((cpu.user + cpu.system) / 1000 / calls),
    cpu_sys_ms_per_call: round(cpu.system / 1000 / calls),
    // the main thread's alone (clock ticks of 10 ms: meaningful over hundreds of calls)
    main_thread_cpu_ms_per_call: main0 === null || main1 === null ? null : round((main1 - main0) / calls),
    journal: {
      bytes_per_call: round(journalBytes / calls),
      fsyncs_per_call: stats ? round(stats.fsyncs / calls) : null,
      rows_per_call: stats ? round(stats.rows / calls) : null,
    },
    machine_fsync_ms: { p50: round(pct(fsyncMs, 50)), p99: round(pct(fsyncMs, 99)) },
    // a new directory and a new file (written, renamed) where the run's state lives, before and after the run
    machine_new_file_ms: { before: newFileBefore, after: newFileAfter },
    // a fixed piece of JavaScript: the machine's speed at the moment, to read another day's figures against
    machine_cpu_unit_ms: cpuUnit,
  };
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.stdout.write(
    `${calls} session calls: p50 ${result.per_call_ms.p50} ms, p99 ${result.per_call_ms.p99} ms per call (poll ${pollMs} ms, owner ${sourceKind} ${placement}), ${result.cpu_ms_per_call} ms CPU (main thread ${result.main_thread_cpu_ms_per_call}), ${result.journal.bytes_per_call} journal bytes and ${result.journal.fsyncs_per_call} fsyncs per call; machine fsync p50 ${result.machine_fsync_ms.p50} ms, a new file p50 ${newFileBefore.file_p50} ms before the run and ${newFileAfter.file_p50} ms after; the CPU unit ${cpuUnit} ms\n`,
  );
}
