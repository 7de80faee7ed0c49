#!/usr/bin/env node
// What a run's branch costs per call: N sequential executor calls (local backend, scripted model, each
// writing one file with the write tool) in a git checkout, where each call gets a worktree at the branch's
// tip and its change becomes a crw commit, against the same calls in a plain directory. The floor, measured
// in the same run in the same repository: the git work a call needs at the least, `git worktree add` +
// `git add -A` + `write-tree` + `commit-tree` + `update-ref` as processes.
// Usage: node bench/flow-branch.mjs [calls=20]   (after npm run build)
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const calls = Number(process.argv[2] ?? 20);
const root = resolve(import.meta.dirname, "..");
const crw = join(root, "apps/crw/bin/crw.mjs");
const dir = mkdtempSync(join(tmpdir(), "crw-bench-flow-branch-"));
const gitEnv = {
  ...process.env,
  GIT_AUTHOR_NAME: "b",
  GIT_AUTHOR_EMAIL: "b@b",
  GIT_COMMITTER_NAME: "b",
  GIT_COMMITTER_EMAIL: "b@b",
};
const git = (cwd, ...args) => execFileSync("git", args, { cwd, env: gitEnv, encoding: "utf8" }).trim();

const workflow = join(dir, "bench.mjs");
writeFileSync(
  workflow,
  `export default { name: "branch-bench", async run(ctx, input) {
    const schema = { type: "object", required: ["ok"], properties: { ok: { type: "boolean" } } };
    for (let i = 0; i < input.calls; i++) await ctx.call({ role: "executor", node: "w", task: "write " + i, schema });
    return input.calls;
  } };`,
);
const script = join(dir, "script.json");
const steps = {};
for (let i = 1; i <= calls; i++)
  steps[`w.${i}`] = [
    { toolCalls: [{ name: "write", arguments: { path: `f${i}.txt`, content: `${i}\n` } }] },
    { text: '{"ok":true}' },
  ];
writeFileSync(script, JSON.stringify({ calls: steps }));

/** A repository with a few hundred files, so a worktree checkout is not free. */
function makeRepo(path) {
  mkdirSync(path, { recursive: true });
  git(path, "init", "-q", "-b", "main");
  for (let i = 0; i < 300; i++) writeFileSync(join(path, `src${i}.txt`), `file ${i}\n`.repeat(20));
  git(path, "add", "-A");
  git(path, "commit", "-q", "-m", "start");
  return path;
}

function runOnce(name, repo) {
  const env = { ...process.env };
  delete env.CODEX_THREAD_ID;
  delete env.CRW_FLOW_FAULT;
  const state = join(dir, `state-${name}`);
  const t0 = Date.now();
  execFileSync(
    process.execPath,
    [
      crw,
      "flow",
      "start",
      workflow,
      "--repo",
      repo,
      "--state",
      state,
      "--run",
      name,
      "--script",
      script,
      "--input",
      JSON.stringify({ calls }),
    ],
    { env, stdio: "ignore", cwd: dir },
  );
  const journal = join(state, "flow", name, "journal.jsonl");
  for (;;) {
    if (existsSync(journal) && readFileSync(journal, "utf8").includes('"type":"run_ended"')) break;
    if (Date.now() - t0 > 600_000) throw new Error(`${name} did not end in 10 minutes`);
    execFileSync("sleep", ["0.02"]);
  }
  return Date.now() - t0;
}

function floorPerCall(repo) {
  const wt = join(dir, "floor");
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < calls; i++) {
    const path = `${wt}-${i}`;
    git(repo, "worktree", "add", "-q", "--detach", path, "HEAD");
    writeFileSync(join(path, `f${i}.txt`), `${i}\n`);
    const index = join(dir, `index-${i}`);
    execFileSync("git", ["add", "-A", "."], { cwd: path, env: { ...gitEnv, GIT_INDEX_FILE: index } });
    const tree = execFileSync("git", ["write-tree"], {
      cwd: path,
      env: { ...gitEnv, GIT_INDEX_FILE: index },
      encoding: "utf8",
    }).trim();
    const commit = execFileSync("git", ["commit-tree", tree, "-p", "HEAD", "-m", "floor"], {
      cwd: path,
      env: gitEnv,
      encoding: "utf8",
    }).trim();
    git(repo, "update-ref", `refs/floor/${i}`, commit);
  }
  return Number(process.hrtime.bigint() - t0) / 1e6 / calls;
}

const plainDir = join(dir, "plain");
mkdirSync(plainDir);
const plainMs = runOnce("plain", plainDir);
const repo = makeRepo(join(dir, "repo"));
const branchMs = runOnce("branch", repo);
const commits = Number(git(repo, "rev-list", "--count", "main..crw/flow/branch"));
const floor = floorPerCall(makeRepo(join(dir, "floor-repo")));
const perCall = (branchMs - plainMs) / calls;
const result = {
  bench: "flow-branch",
  calls,
  plain_run_ms: plainMs,
  branch_run_ms: branchMs,
  branch_commits: commits,
  branch_overhead_per_call_ms: Number(perCall.toFixed(1)),
  floor_git_per_call_ms: Number(floor.toFixed(1)),
  ratio_to_floor: Number((perCall / floor).toFixed(2)),
};
rmSync(dir, { recursive: true, force: true });
process.stdout.write(`${JSON.stringify(result)}\n`);
process.stdout.write(
  `flow branch: ${calls} executor calls, ${commits} commits; ${result.branch_overhead_per_call_ms} ms per call over a plain directory vs ${result.floor_git_per_call_ms} ms of bare git per call (${result.ratio_to_floor}x)\n`,
);
