import { existsSync, readdirSync, rmdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { GitWorkspaceError, git, gitRun } from "./exec.js";

/**
 * Executor workspaces: one git worktree per allocation, made at the allocation's start commit (detached:
 * the run moves no branch of the user's), found again by a resumed run (restored, not made twice), and
 * removed when the allocation is retired.
 */
export function worktreePath(workspacesDir: string, node: string, allocation: string): string {
  const safe = (s: string) => s.replace(/[^A-Za-z0-9._-]/g, "_");
  return join(workspacesDir, `${safe(node)}-${safe(allocation)}`);
}

export async function headOf(dir: string): Promise<string> {
  return git(dir, ["rev-parse", "--verify", "HEAD^{commit}"]);
}

/** The repository's common git directory, absolute: the same for a repository and its worktrees. */
export async function commonDir(dir: string): Promise<string> {
  return resolve(dir, await git(dir, ["rev-parse", "--git-common-dir"]));
}

export interface WorktreeAllocation {
  path: string;
  /** false when the worktree already existed (a resumed run restores it). */
  created: boolean;
  head: string;
}

/**
 * One worktree made at a time per repository in this process: parallel calls of a run would otherwise
 * race `worktree prune` of one against `worktree add` of another.
 */
const making = new Map<string, Promise<unknown>>();

export function ensureWorktree(options: {
  repo: string;
  path: string;
  commit: string;
}): Promise<WorktreeAllocation> {
  const key = resolve(options.repo);
  const before = making.get(key) ?? Promise.resolve();
  const next = before.then(
    () => makeWorktree(options),
    () => makeWorktree(options),
  );
  making.set(
    key,
    next.catch(() => {}),
  );
  return next;
}

/**
 * Commits found in each repository by this process. The calls of a run mostly start at the same commit, and
 * each git command is a process spawned (several ms of the run process's CPU): a commit verified once is
 * not asked for again, since it stays in the repository while the run's branch refers to it.
 */
const knownCommits = new Map<string, Set<string>>();

async function verifiedCommit(repo: string, commit: string): Promise<string> {
  const key = resolve(repo);
  const known = knownCommits.get(key) ?? new Set<string>();
  if (known.has(commit)) return commit;
  const sha = await git(repo, ["rev-parse", "--verify", `${commit}^{commit}`]);
  known.add(sha);
  knownCommits.set(key, known);
  return sha;
}

async function makeWorktree(options: {
  repo: string;
  path: string;
  commit: string;
}): Promise<WorktreeAllocation> {
  const start = await verifiedCommit(options.repo, options.commit);
  if (existsSync(options.path)) {
    const inside = await gitRun(options.path, ["rev-parse", "--show-toplevel"]);
    if (inside.code === 0 && resolve(inside.stdout.trim()) === resolve(options.path)) {
      if ((await commonDir(options.path)) === (await commonDir(options.repo)))
        return { path: options.path, created: false, head: await headOf(options.path) };
    }
    // a `worktree add` cut short (the process died) leaves an empty directory: made again; anything
    // else in the way is never removed
    if (readdirSync(options.path).length > 0)
      throw new GitWorkspaceError(
        "not_a_checkout",
        `${options.path} exists and is no worktree of ${options.repo}`,
      );
    rmdirSync(options.path);
  }
  // a registration whose directory is gone (a run's state removed) blocks the add: pruned, then again
  const add = ["worktree", "add", "--detach", options.path, start];
  if ((await gitRun(options.repo, add)).code !== 0) {
    await git(options.repo, ["worktree", "prune"]);
    await git(options.repo, add);
  }
  return { path: options.path, created: true, head: start };
}

export async function removeWorktree(options: { repo: string; path: string }): Promise<void> {
  if (!existsSync(options.path)) {
    await git(options.repo, ["worktree", "prune"]);
    return;
  }
  await git(options.repo, ["worktree", "remove", "--force", options.path]);
}
