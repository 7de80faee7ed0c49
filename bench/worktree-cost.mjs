#!/usr/bin/env node
// What an isolated child worktree costs on a repository of 10,000 small committed files: createIsolatedWorktree,
// editing 10 files, commitLeftovers, removeIsolatedWorktree, next to the floor measured in the same run
// (`git status` of the repository, and a bare `git worktree add --detach` + `git worktree remove`). Built code:
// run `npx tsup` in packages/brain first. Prints one JSON object, then a one-line summary.
// Usage: node bench/worktree-cost.mjs [iterations=10] [files=10000]
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import os, { tmpdir } from "node:os";
import { join } from "node:path";

const iterations = Number(process.argv[2] ?? 10);
const fileCount = Number(process.argv[3] ?? 10_000);
const ws = await import("../packages/brain/dist/index.js");

const round = (x) => Math.round(x * 100) / 100;
const stats = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))];
  return {
    n: s.length,
    minMs: round(s[0]),
    p50Ms: round(q(0.5)),
    p99Ms: round(q(0.99)),
    maxMs: round(s.at(-1)),
  };
};
const env = {
  ...process.env,
  GIT_AUTHOR_NAME: "bench",
  GIT_AUTHOR_EMAIL: "bench@localhost",
  GIT_COMMITTER_NAME: "bench",
  GIT_COMMITTER_EMAIL: "bench@localhost",
};
const git = (cwd, ...args) => execFileSync("git", args, { cwd, env, encoding: "utf8", maxBuffer: 1 << 28 });
const timed = async (fn) => {
  const t = performance.now();
  await fn();
  return performance.now() - t;
};

const root = realpathSync(mkdtempSync(join(tmpdir(), "crw-bench-worktree-")));
const repo = join(root, "repo");
const worktrees = join(root, "worktrees");
const setupStart = performance.now();
for (let i = 0; i < fileCount; i++) {
  const dir = join(repo, `d${String(Math.floor(i / 100)).padStart(3, "0")}`);
  if (i % 100 === 0) mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, `f${i}.txt`), `file ${i}\n`);
}
git(repo, "init", "-q", "-b", "main");
git(repo, "add", "-A");
git(repo, "commit", "-q", "-m", "bench files");
const setupMs = performance.now() - setupStart;

const results = { gitStatus: [], bareAddRemove: [], create: [], edit: [], commit: [], remove: [], total: [] };
for (let i = 0; i < iterations; i++) {
  // Interleaved so machine load affects floor and measurement alike.
  results.gitStatus.push(await timed(() => git(repo, "status", "--porcelain")));
  const bare = join(worktrees, `bare-${i}`);
  results.bareAddRemove.push(
    await timed(() => {
      git(repo, "worktree", "add", "-q", "--detach", bare, "HEAD");
      git(repo, "worktree", "remove", "--force", bare);
    }),
  );
  const branch = `crw/bench-${i}`;
  let wt;
  const create = await timed(async () => {
    wt = await ws.createIsolatedWorktree({
      repoDir: repo,
      worktreesDir: worktrees,
      branch,
      from: { head: true },
    });
  });
  const edit = await timed(() => {
    for (let k = 0; k < 10; k++) {
      const n = ((i * 10 + k) * 97) % fileCount;
      const dir = `d${String(Math.floor(n / 100)).padStart(3, "0")}`;
      writeFileSync(join(wt.path, dir, `f${n}.txt`), `file ${n} edited in run ${i}\n`);
    }
  });
  let committed;
  const commit = await timed(async () => {
    committed = await ws.commitLeftovers({ worktree: wt, message: `bench run ${i}` });
  });
  if (committed.changedPaths.length !== 10)
    throw new Error(`expected 10 changed paths, got ${committed.changedPaths.length}`);
  const remove = await timed(() => ws.removeIsolatedWorktree({ path: wt.path }));
  git(repo, "branch", "-q", "-D", branch);
  results.create.push(create);
  results.edit.push(edit);
  results.commit.push(commit);
  results.remove.push(remove);
  results.total.push(create + edit + commit + remove);
}
rmSync(root, { recursive: true, force: true });

const out = {
  bench: "worktree-cost",
  node: process.version,
  git: git(process.cwd(), "--version").trim(),
  cpus: os.availableParallelism(),
  loadAverage1m: os.loadavg()[0],
  iterations,
  files: fileCount,
  setupMs: round(setupMs),
  floor: { gitStatus: stats(results.gitStatus), bareWorktreeAddRemove: stats(results.bareAddRemove) },
  createIsolatedWorktree: stats(results.create),
  edit10Files: stats(results.edit),
  commitLeftovers: stats(results.commit),
  removeIsolatedWorktree: stats(results.remove),
  total: stats(results.total),
};
out.totalOverBareP50Ms = round(out.total.p50Ms - out.floor.bareWorktreeAddRemove.p50Ms);
console.log(JSON.stringify(out, null, 2));
console.log(
  `load ${os.loadavg()[0].toFixed(1)}; ${fileCount} files: create+edit+commit+remove p50 ${out.total.p50Ms} ms (p99 ${out.total.p99Ms}) vs bare worktree add+remove ${out.floor.bareWorktreeAddRemove.p50Ms} ms and git status ${out.floor.gitStatus.p50Ms} ms; create ${out.createIsolatedWorktree.p50Ms}, commit ${out.commitLeftovers.p50Ms}, remove ${out.removeIsolatedWorktree.p50Ms} ms p50, ${iterations} runs`,
);
