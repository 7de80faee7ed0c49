import { existsSync, mkdirSync, readdirSync } from "node:fs";
import { resolve } from "node:path";
import { WorkspaceError } from "./errors.js";
import { git, gitFailure, runGit } from "./git.js";
import { combineCommits } from "./merge.js";
import {
  assertBranchName,
  branchTip,
  checkedOutBranch,
  commitOf,
  commonDir,
  isAncestor,
  listWorktrees,
  samePath,
  type WorktreeEntry,
  worktreeTop,
} from "./repository.js";
import { oneWorktreeChangeAtATime } from "./serial.js";

/**
 * Where a child's branch starts:
 * - `{ head: true }`: the commit checked out in `repoDir` now (the parent's HEAD);
 * - `{ commit }`: a commit id (any revision git resolves to a commit);
 * - `{ branches }`: local branches of the node's dependencies, combined. When one contains all the others
 *   it is a fast-forward to that one; else crw makes one merge commit whose parents are the branch tips in
 *   the order given. Branches that conflict throw `merge_conflict` (`context.paths`) before anything exists.
 */
export type WorktreeBase = { head: true } | { commit: string } | { branches: readonly string[] };

export interface CreateIsolatedWorktreeOptions {
  /** Any directory inside the git working tree the work happens in. */
  repoDir: string;
  /** Parent directory of the worktrees, made if missing. Outside the working tree keeps `git status` of the repository clean. */
  worktreesDir: string;
  /** The child's own branch, e.g. `crw/<short id>`: made by this call, never by the agent. */
  branch: string;
  from: WorktreeBase;
  /** The worktree's directory name under `worktreesDir`; by default the branch with `/` as `-`. */
  name?: string;
}

/**
 * A child's worktree. `startedFromBranch` is the branch checked out in `repoDir` at the call (null when its
 * HEAD is detached): the branch `landBranch` later merges the result into. `baseCommit` is the commit the
 * branch was made at; `diffStat(repoRoot, baseCommit, tip)` shows what the child did.
 */
export interface IsolatedWorktree {
  path: string;
  branch: string;
  baseCommit: string;
  startedFromBranch: string | null;
  /** The top of the working tree `repoDir` is in. */
  repoRoot: string;
  /** true when an earlier call (cut short by a crash, or simply made before) had made it already. */
  reused: boolean;
}

/**
 * Makes a worktree of the repository on a new branch (`git worktree add -b`). Idempotent: a worktree already
 * at the path on that branch is returned as it is, and a branch left by a call that died before its worktree
 * was made is checked out again rather than refused, so retrying after a crash at any point succeeds. A path
 * taken by anything else, or the branch checked out elsewhere, is `worktree_conflict`. On failure nothing
 * this call made is left: no branch, no worktree, no worktree directory.
 */
export async function createIsolatedWorktree(
  options: CreateIsolatedWorktreeOptions,
): Promise<IsolatedWorktree> {
  const repoRoot = await worktreeTop(options.repoDir);
  const { branch } = options;
  await assertBranchName(repoRoot, branch);
  const name = options.name ?? branch.replace(/[^A-Za-z0-9._-]+/g, "-");
  // one path segment: a name like `../x` would put the worktree outside worktreesDir
  if (name === "" || name === "." || name === ".." || /[/\\]/.test(name))
    throw new WorkspaceError("invalid_input", `'${name}' is no directory name`, { name });
  const path = resolve(options.worktreesDir, name);
  return oneWorktreeChangeAtATime(await commonDir(repoRoot), () =>
    makeOrReuse(repoRoot, path, branch, options),
  );
}

async function makeOrReuse(
  repoRoot: string,
  path: string,
  branch: string,
  options: CreateIsolatedWorktreeOptions,
): Promise<IsolatedWorktree> {
  const startedFromBranch = await checkedOutBranch(repoRoot);
  const made = { path, branch, startedFromBranch, repoRoot };

  let entries = await listWorktrees(repoRoot);
  const half = entries.find((e) => samePath(e.path, path) && e.initializing);
  if (half) {
    // A checkout cut off by a crash: its files are partial, and committing them would record deletions.
    // It is made again from its branch, which is intact.
    await git(repoRoot, ["worktree", "remove", "--force", "--force", path]);
    entries = await listWorktrees(repoRoot);
  }
  const atPath = entries.find((e) => samePath(e.path, path));
  const onBranch = entries.find((e) => e.branch === branch);
  if (atPath && !atPath.prunable && atPath.branch === branch)
    return { ...made, baseCommit: await branchBase(repoRoot, branch), reused: true };
  assertFree(path, branch, atPath, onBranch);
  // a registration whose directory is gone (removed by hand, or a crash) would block the path or branch
  if (atPath?.prunable || onBranch?.prunable) await git(repoRoot, ["worktree", "prune"]);

  if ((await commitOf(repoRoot, `refs/heads/${branch}`)) !== null) {
    mkdirSync(options.worktreesDir, { recursive: true });
    await git(repoRoot, ["worktree", "add", "--quiet", path, branch]);
    return { ...made, baseCommit: await branchBase(repoRoot, branch), reused: true };
  }
  // the base first: a merge conflict among `from` branches must find nothing made yet
  const baseCommit = await resolveBase(repoRoot, options.from);
  mkdirSync(options.worktreesDir, { recursive: true });
  await addOnNewBranch(repoRoot, path, branch, baseCommit);
  return { ...made, baseCommit, reused: false };
}

function assertFree(
  path: string,
  branch: string,
  atPath: WorktreeEntry | undefined,
  onBranch: WorktreeEntry | undefined,
): void {
  if (atPath && !atPath.prunable)
    throw new WorkspaceError(
      "worktree_conflict",
      `${path} is a worktree on ${atPath.branch ?? "no branch"}`,
      {
        path,
        branch,
        found: atPath.branch,
      },
    );
  if (onBranch && !onBranch.prunable)
    throw new WorkspaceError("worktree_conflict", `${branch} is checked out at ${onBranch.path}`, {
      path,
      branch,
      checkedOutAt: onBranch.path,
    });
  // `worktree add` fills an empty directory (one a crash left behind); anything else is never touched
  if (existsSync(path) && readdirSync(path).length > 0)
    throw new WorkspaceError("worktree_conflict", `${path} exists and is no worktree`, { path, branch });
}

async function resolveBase(repoRoot: string, from: WorktreeBase): Promise<string> {
  if ("head" in from) {
    const head = await commitOf(repoRoot, "HEAD");
    if (head === null) throw new WorkspaceError("unknown_ref", `${repoRoot} has no commit yet`, { repoRoot });
    return head;
  }
  if ("commit" in from) {
    const commit = await commitOf(repoRoot, from.commit);
    if (commit === null)
      throw new WorkspaceError("unknown_ref", `'${from.commit}' names no commit`, { commit: from.commit });
    return commit;
  }
  if (from.branches.length === 0)
    throw new WorkspaceError("invalid_input", "from.branches lists no branch", { branches: [] });
  const tips = [];
  for (const b of from.branches) tips.push({ commit: await branchTip(repoRoot, b), label: b });
  const message = `crw: merge ${from.branches.join(", ")}`;
  return (await combineCommits(repoRoot, tips, message)).commit;
}

async function addOnNewBranch(repoRoot: string, path: string, branch: string, base: string): Promise<void> {
  // the branch's reflog is where a retry reads the base back from, so it is written whatever the config says
  const args = ["-c", "core.logAllRefUpdates=true", "worktree", "add", "--quiet", "-b", branch, path, base];
  const r = await runGit(repoRoot, args);
  if (r.exitCode === 0) return;
  // `worktree add -b` makes the branch before the checkout and keeps it when the checkout fails
  await runGit(repoRoot, ["update-ref", "-d", `refs/heads/${branch}`, base]);
  await runGit(repoRoot, ["worktree", "prune"]);
  throw gitFailure(repoRoot, args, r);
}

/**
 * The commit a branch was made at: the oldest entry of its reflog, when that is still an ancestor of the tip;
 * else (no reflog, or history rewritten) the tip itself.
 */
async function branchBase(repoRoot: string, branch: string): Promise<string> {
  const tip = await branchTip(repoRoot, branch);
  const r = await runGit(repoRoot, ["reflog", "show", "--format=%H", `refs/heads/${branch}`, "--"]);
  const oldest = r.exitCode === 0 ? r.stdout.trim().split("\n").at(-1) : undefined;
  if (oldest && /^[0-9a-f]{40,64}$/.test(oldest) && (await isAncestor(repoRoot, oldest, tip))) return oldest;
  return tip;
}
