#!/usr/bin/env node
// The spawn hook's added latency per spawn (built code: run `npx tsup` in packages/flow and apps/crw first).
// Codex runs `crw flow hook pre-tool-use` as a new process on every spawn_agent of every session of the
// CODEX_HOME it is installed in. Measures cold processes, one after the other, against `node -e 0`:
//   - node -e 0 (the floor: a Node process at all),
//   - the hook for a session bound to no run (read the binding, print nothing),
//   - the hook for a bound owner's spawn (read the binding, decide, append and fsync the ledger line,
//     print the rewritten input).
// Prints one JSON object, then a one-line summary. Usage: node bench/flow-hook-latency.mjs [runs]
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const runs = Number(process.argv[2] ?? 30);
const crw = new URL("../apps/crw/bin/crw.mjs", import.meta.url).pathname;
const state = mkdtempSync(join(tmpdir(), "crw-bench-hook-"));
const owner = "019a0000-beef-7000-8000-000000000001";
const bound = join(state, "flow-bound");
mkdirSync(bound, { mode: 0o700 });
const pairs = {
  architect: { model: "m-arch", effort: "high" },
  executor: { model: "m-exec", effort: "high" },
  "executor-t1": { model: "m-t1" },
  reviewer: { model: "m-rev", effort: "medium" },
  explorer: {},
  critic: {},
};
writeFileSync(
  join(bound, `${owner}.jsonl`),
  `${JSON.stringify({ v: 1, kind: "orchestrator", run_id: "bench", policyDigest: "d", helperPairs: pairs, at: new Date().toISOString() })}\n`,
  { mode: 0o600 },
);
const input = (session) =>
  JSON.stringify({
    session_id: session,
    turn_id: "t",
    transcript_path: join(state, "none.jsonl"),
    cwd: state,
    hook_event_name: "PreToolUse",
    tool_name: "spawn_agent",
    tool_input: {
      message:
        "crw-flow-op: build/t1-a1\nCRW-ROLE: executor\n\nYour shell starts in a directory that is NOT your workspace.",
      agent_type: "executor",
      model: "cheap",
      reasoning_effort: "low",
    },
    tool_use_id: "call_1",
  });

function time(args, stdin) {
  const samples = [];
  for (let i = 0; i < runs; i++) {
    const t0 = process.hrtime.bigint();
    const r = spawnSync(process.execPath, args, { input: stdin ?? "", encoding: "utf8" });
    samples.push(Number(process.hrtime.bigint() - t0) / 1e6);
    if (r.status !== 0) throw new Error(`${args.join(" ")} exited ${r.status}: ${r.stderr}`);
  }
  samples.sort((a, b) => a - b);
  const q = (p) => Number(samples[Math.min(samples.length - 1, Math.floor(p * samples.length))].toFixed(1));
  return { p50_ms: q(0.5), p90_ms: q(0.9), min_ms: q(0) };
}

const hook = [crw, "flow", "hook", "pre-tool-use", "--state", state];
const check = spawnSync(process.execPath, hook, { input: input(owner), encoding: "utf8" });
if (!check.stdout.includes('"m-exec"'))
  throw new Error(`the hook did not rewrite: ${check.stdout} ${check.stderr}`);
time(["-e", "0"]); // warm the file cache
const node = time(["-e", "0"]);
const unbound = time(hook, input("019a0000-0000-7000-8000-00000000dead"));
const boundSpawn = time(hook, input(owner));
rmSync(state, { recursive: true, force: true });
const result = {
  bench: "flow-hook-latency",
  runs,
  node_e0: node,
  hook_unbound: unbound,
  hook_bound_spawn: boundSpawn,
  added_p50_ms: Number((boundSpawn.p50_ms - node.p50_ms).toFixed(1)),
  ratio_p50: Number((boundSpawn.p50_ms / node.p50_ms).toFixed(2)),
};
console.log(JSON.stringify(result));
console.log(
  `hook: bound spawn p50 ${boundSpawn.p50_ms} ms (unbound ${unbound.p50_ms} ms) vs node -e 0 p50 ${node.p50_ms} ms: +${result.added_p50_ms} ms per spawn (${result.ratio_p50}x)`,
);
